//! The data of a labelled scatter against a target (`qsim options`: each
//! deployment option's cost against its completion time or p95): every
//! point labelled with its name, the ones that meet the targets in colour,
//! the ones that miss in grey, the chosen one (the cheapest that meets
//! them) ringed in red, and the target a dashed vertical line. An axis is
//! logarithmic when its values are all > 0 and span more than a factor of
//! 20. Drawn by the crate root; `scatter_figure` makes the figure. (Plain
//! data only: this module names nothing of the root, so no module cycle.)

/// How a point is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Meets the targets: filled, palette colour 0.
    Meets,
    /// Misses a target: filled grey (`DOMINATED`).
    Misses,
    /// The chosen one (meets the targets): palette colour 0 with a red ring
    /// ([`CHOSEN`]).
    Chosen,
}

/// Colour of the chosen point's ring and legend key.
pub const CHOSEN: (u8, u8, u8) = (0xe1, 0x57, 0x59);

/// One labelled point.
#[derive(Debug, Clone, PartialEq)]
pub struct ScatterPoint {
    pub label: String,
    pub x: f64,
    pub y: f64,
    pub mark: Mark,
}

/// A dashed vertical line at `x` (a target), labelled.
#[derive(Debug, Clone, PartialEq)]
pub struct VLine {
    pub label: String,
    pub x: f64,
}

/// A labelled scatter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scatter {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub points: Vec<ScatterPoint>,
    pub vline: Option<VLine>,
}
