//! Inspecting drawn figures (for tests): an SVG's size and series, a PNG's
//! size and the series colours it shows. The checks count what the
//! figure functions draw, so a missing or extra series fails them.
//!
//! In the SVG every series is one `<polyline>` of stroke width 2 in its
//! palette colour (floors are dashes of width 1, capacity is black) and one
//! 16 × 10 legend swatch; a heatmap cell is one filled `<rect>`.

use crate::PALETTE;

/// The attributes of each `<TAG …>` element of `svg`, as (name, value).
pub fn elements<'a>(svg: &'a str, tag: &str) -> Vec<Vec<(&'a str, &'a str)>> {
    let open = format!("<{tag} ");
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find(&open) {
        let body = &rest[i + open.len()..];
        let end = body.find('>').unwrap_or(body.len());
        let mut attrs = Vec::new();
        let mut a = &body[..end];
        while let Some(eq) = a.find("=\"") {
            let name = a[..eq].trim();
            let v = &a[eq + 2..];
            let close = v.find('"').unwrap_or(v.len());
            attrs.push((name, &v[..close]));
            a = &v[(close + 1).min(v.len())..];
        }
        out.push(attrs);
        rest = &body[end..];
    }
    out
}

fn attr<'a>(e: &[(&'a str, &'a str)], name: &str) -> Option<&'a str> {
    e.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

fn hex(c: (u8, u8, u8)) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// The index in [`PALETTE`] of an SVG colour `#RRGGBB`.
pub fn palette_index(color: &str) -> Option<usize> {
    PALETTE
        .iter()
        .position(|&c| hex(c).eq_ignore_ascii_case(color))
}

/// `width` and `height` of the root `<svg>` element.
pub fn svg_size(svg: &str) -> Option<(u32, u32)> {
    let e = elements(svg, "svg").into_iter().next()?;
    Some((
        attr(&e, "width")?.parse().ok()?,
        attr(&e, "height")?.parse().ok()?,
    ))
}

/// Series lines: `<polyline>` elements of stroke width 2 in a palette
/// colour, as their palette indices (one per drawn series and panel).
pub fn svg_series(svg: &str) -> Vec<usize> {
    elements(svg, "polyline")
        .iter()
        .filter(|e| attr(e, "stroke-width") == Some("2"))
        .filter_map(|e| attr(e, "stroke").and_then(palette_index))
        .collect()
}

/// Legend swatches: 16 × 10 filled rectangles, as their fill colours.
pub fn svg_legend(svg: &str) -> Vec<String> {
    elements(svg, "rect")
        .iter()
        .filter(|e| attr(e, "width") == Some("16") && attr(e, "height") == Some("10"))
        .filter_map(|e| attr(e, "fill").map(str::to_string))
        .collect()
}

/// Filled `<rect>`s other than the white background and legend boxes
/// (heatmap cells).
pub fn svg_filled_rects(svg: &str) -> usize {
    elements(svg, "rect")
        .iter()
        .filter(|e| {
            let f = attr(e, "fill").unwrap_or("none");
            f != "none"
                && !f.eq_ignore_ascii_case("#FFFFFF")
                && !(attr(e, "width") == Some("16") && attr(e, "height") == Some("10"))
        })
        .count()
}

/// `<circle>`s filled with `color` (`#RRGGBB`).
pub fn svg_circles(svg: &str, color: (u8, u8, u8)) -> usize {
    let c = hex(color);
    elements(svg, "circle")
        .iter()
        .filter(|e| attr(e, "fill").is_some_and(|f| f.eq_ignore_ascii_case(&c)))
        .count()
}

/// Width and height from a PNG's signature and IHDR chunk (None if the
/// bytes are not a PNG).
pub fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    const SIG: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    if bytes.len() < 24 || bytes[..8] != SIG || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(bytes[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(bytes[20..24].try_into().ok()?);
    Some((w, h))
}

/// A decoded PNG: its size and which [`PALETTE`] colours appear in it
/// (exactly: lines and legend swatches are drawn in the plain colour).
pub fn png_palette(bytes: &[u8]) -> Result<((u32, u32), Vec<usize>), String> {
    let mut dec = png::Decoder::new(bytes);
    dec.set_transformations(png::Transformations::EXPAND);
    let mut reader = dec.read_info().map_err(|e| e.to_string())?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).map_err(|e| e.to_string())?;
    let step = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => return Err(format!("unexpected colour type {other:?}")),
    };
    let mut seen = [false; PALETTE.len()];
    for px in buf[..info.buffer_size()].chunks_exact(step) {
        if let Some(i) = PALETTE.iter().position(|&c| (px[0], px[1], px[2]) == c) {
            seen[i] = true;
        }
    }
    Ok((
        (info.width, info.height),
        (0..PALETTE.len()).filter(|&i| seen[i]).collect(),
    ))
}

/// Every `<text>` element: (its content trimmed, fill, x, y).
pub fn svg_texts(svg: &str) -> Vec<(String, String, f64, f64)> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<text ") {
        let body = &rest[i..];
        let Some(end) = body.find("</text>") else {
            break;
        };
        let open_end = body.find('>').unwrap_or(end);
        let e = elements(&body[..open_end + 1], "text")
            .into_iter()
            .next()
            .unwrap_or_default();
        let num = |n: &str| attr(&e, n).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
        out.push((
            body[open_end + 1..end].trim().to_string(),
            attr(&e, "fill").unwrap_or("").to_string(),
            num("x"),
            num("y"),
        ));
        rest = &body[end..];
    }
    out
}

/// The legend's entries: (label, swatch colour), each swatch paired with
/// the text on its line to its right.
pub fn svg_legend_entries(svg: &str) -> Vec<(String, String)> {
    let texts = svg_texts(svg);
    elements(svg, "rect")
        .iter()
        .filter(|e| attr(e, "width") == Some("16") && attr(e, "height") == Some("10"))
        .filter_map(|e| {
            let x: f64 = attr(e, "x")?.parse().ok()?;
            let y: f64 = attr(e, "y")?.parse().ok()?;
            let t = texts
                .iter()
                .filter(|t| t.3 == y && t.2 > x)
                .min_by(|a, b| a.2.total_cmp(&b.2))?;
            Some((t.0.clone(), attr(e, "fill")?.to_string()))
        })
        .collect()
}

/// Series lines as (stroke colour, number of points), in drawing order
/// (width-2 `<polyline>`s in a palette colour).
pub fn svg_series_lines(svg: &str) -> Vec<(String, usize)> {
    elements(svg, "polyline")
        .iter()
        .filter(|e| attr(e, "stroke-width") == Some("2"))
        .filter_map(|e| {
            let c = attr(e, "stroke")?;
            palette_index(c)?;
            let n = attr(e, "points")?.split_whitespace().count();
            Some((c.to_string(), n))
        })
        .collect()
}

/// Dashed horizontal lines of width 1 in palette colours (floors): per
/// pixel row, the colours of its dashes.
pub fn svg_dash_rows(svg: &str) -> Vec<(i64, Vec<String>)> {
    let mut rows: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
    for e in elements(svg, "polyline") {
        if attr(&e, "stroke-width") != Some("1") {
            continue;
        }
        let (Some(c), Some(p)) = (attr(&e, "stroke"), attr(&e, "points")) else {
            continue;
        };
        if palette_index(c).is_none() {
            continue;
        }
        let ys: Vec<i64> = p
            .split_whitespace()
            .filter_map(|xy| xy.split_once(',').and_then(|(_, y)| y.parse().ok()))
            .collect();
        if ys.len() == 2 && ys[0] == ys[1] {
            let r = rows.entry(ys[0]).or_default();
            if !r.iter().any(|x| x == c) {
                r.push(c.to_string());
            }
        }
    }
    rows.into_iter().collect()
}

/// Filled `<polygon>`s in `color` (the markers of points beyond a cut
/// axis, and bands in their translucent colour: those have an opacity).
pub fn svg_markers(svg: &str, color: (u8, u8, u8)) -> usize {
    let c = hex(color);
    elements(svg, "polygon")
        .iter()
        .filter(|e| attr(e, "fill").is_some_and(|f| f.eq_ignore_ascii_case(&c)))
        .filter(|e| attr(e, "opacity").is_none_or(|o| o == "1"))
        .count()
}
