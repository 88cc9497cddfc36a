//! One self-contained HTML page: headings, paragraphs, preformatted text,
//! tables and inline SVG figures, with its style inline. No scripts and no
//! external resources: it opens from a file in any browser.

/// A part of the page, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Heading(String),
    Paragraph(String),
    /// Preformatted text (a text report, as the terminal shows it).
    Pre(String),
    /// A table: header cells and rows of cells.
    Table {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    /// An SVG figure (the text of [`crate::Figure::svg`]) and its caption.
    Figure {
        svg: String,
        caption: String,
    },
}

/// An HTML document.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Document {
    pub title: String,
    pub blocks: Vec<Block>,
}

/// Escape text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}\
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}\
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:12px;line-height:1.35}\
table{border-collapse:collapse;margin:1em 0;font-size:13px}\
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}\
th,td{vertical-align:bottom}th span,td span{white-space:nowrap}\
div.t{overflow-x:auto}th{background:#eee}\
td:first-child,th:first-child{text-align:left}\
figure{margin:1.5em 0}figure svg{box-sizing:border-box;max-width:100%;height:auto;border:1px solid #eee}\
figcaption{font-size:13px;color:#555}";

/// A table cell's text that breaks only between its words (a number and
/// its spread `8.8 [8.4–9.2]`, a header `latency p95 (s)`), never inside
/// one (`exp2-backoff`, `8.4–9.2`): a wide table fits a narrow window by
/// taking more lines, not by running past the page's edge.
fn cell(s: &str) -> String {
    s.split(' ')
        .filter(|w| !w.is_empty())
        .map(|w| format!("<span>{}</span>", escape(w)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The SVG element of plotters' output, without the XML declaration, sized
/// by its viewBox so that the page can scale it.
fn inline_svg(svg: &str) -> String {
    let start = svg.find("<svg").unwrap_or(0);
    let body = &svg[start..];
    // plotters writes `<svg width="W" height="H" viewBox="0 0 W H" …>`
    body.to_string()
}

impl Document {
    pub fn new(title: &str) -> Document {
        Document {
            title: title.into(),
            blocks: vec![],
        }
    }

    pub fn push(&mut self, b: Block) -> &mut Self {
        self.blocks.push(b);
        self
    }

    /// The page as HTML text.
    pub fn render(&self) -> String {
        let mut o = String::new();
        o.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
        o.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
        // an empty icon: the browser asks for no /favicon.ico
        o.push_str("<link rel=\"icon\" href=\"data:,\">\n");
        o.push_str(&format!("<title>{}</title>\n", escape(&self.title)));
        o.push_str(&format!("<style>{STYLE}</style>\n</head>\n<body>\n"));
        o.push_str(&format!("<h1>{}</h1>\n", escape(&self.title)));
        for b in &self.blocks {
            match b {
                Block::Heading(t) => o.push_str(&format!("<h2>{}</h2>\n", escape(t))),
                Block::Paragraph(t) => o.push_str(&format!("<p>{}</p>\n", escape(t))),
                Block::Pre(t) => o.push_str(&format!("<pre>{}</pre>\n", escape(t))),
                Block::Table { header, rows } => {
                    o.push_str("<div class=\"t\"><table>\n<thead><tr>");
                    for h in header {
                        o.push_str(&format!("<th>{}</th>", cell(h)));
                    }
                    o.push_str("</tr></thead>\n<tbody>\n");
                    for r in rows {
                        o.push_str("<tr>");
                        for c in r {
                            o.push_str(&format!("<td>{}</td>", cell(c)));
                        }
                        o.push_str("</tr>\n");
                    }
                    o.push_str("</tbody>\n</table></div>\n");
                }
                Block::Figure { svg, caption } => {
                    o.push_str("<figure>\n");
                    o.push_str(&inline_svg(svg));
                    o.push_str(&format!(
                        "\n<figcaption>{}</figcaption>\n</figure>\n",
                        escape(caption)
                    ));
                }
            }
        }
        o.push_str("</body>\n</html>\n");
        o
    }
}
