//! Unit tests of qsim_plot through its public API (moved here from the
//! crate so the workspace has one test binary fewer).

mod html {
    use qsim_plot::html::*;

    #[test]
    fn escapes_and_has_no_external_resources() {
        let mut d = Document::new("a <b> & \"c\"");
        d.push(Block::Table {
            header: vec!["x".into()],
            rows: vec![vec!["<script>".into()]],
        });
        let h = d.render();
        assert!(h.contains("&lt;script&gt;"));
        assert!(!h.contains("<script"));
        assert!(!h.contains("http://") && !h.contains("https://"));
    }
}

mod lib {
    use qsim_plot::*;

    #[test]
    fn front_of_a_small_set() {
        let p = |x, y| ParetoPoint {
            label: String::new(),
            x,
            y,
        };
        let pts = vec![
            p(3.0, 1.0),
            p(1.0, 3.0),
            p(2.0, 2.0),
            p(2.5, 2.5),
            p(1.0, 4.0),
            p(f64::NAN, 0.0),
        ];
        assert_eq!(pareto_front(&pts), vec![1, 2, 0]);
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(fmt_num(128.0), "128");
        assert_eq!(fmt_num(12.5), "12.5");
        assert_eq!(fmt_num(0.25), "0.25");
        assert_eq!(fmt_num(2e7), "2.0e7");
    }
}

mod scatter {
    use qsim_plot::scatter::*;

    fn point(label: &str, x: f64, y: f64, mark: Mark) -> ScatterPoint {
        ScatterPoint {
            label: label.into(),
            x,
            y,
            mark,
        }
    }

    fn svg(points: Vec<ScatterPoint>) -> String {
        qsim_plot::scatter_figure(vec![Scatter {
            title: "t".into(),
            x_label: "x (s)".into(),
            y_label: "cost ($)".into(),
            points,
            vline: Some(VLine {
                label: "target".into(),
                x: 2.0,
            }),
        }])
        .svg()
        .unwrap()
    }

    #[test]
    fn marks_labels_and_log_axes_only_past_a_20x_span() {
        let s = svg(vec![
            point("a", 1.0, 1.0, Mark::Meets),
            point("b", 3.0, 2.0, Mark::Misses),
            point("c", 1.5, 0.5, Mark::Chosen),
            // not drawn, no panic
            point("nan", f64::NAN, 1.0, Mark::Meets),
        ]);
        let blue = qsim_plot::PALETTE[0];
        assert_eq!(qsim_plot::check::svg_circles(&s, blue), 2);
        assert_eq!(qsim_plot::check::svg_circles(&s, qsim_plot::DOMINATED), 1);
        // a text element's content is a line of its own
        let text = |s: &str, t: &str| s.lines().any(|l| l.trim() == t);
        assert!(text(&s, "a") && text(&s, "b") && text(&s, "c"));
        assert!(!text(&s, "nan"));
        assert!(s.contains("cheapest meeting them: c"));
        assert!(!s.contains("log scale"), "spans of 3x and 4x: linear");
        let wide = svg(vec![
            point("a", 1.0, 0.01, Mark::Meets),
            point("b", 100.0, 0.02, Mark::Meets),
        ]);
        assert!(wide.contains("x (s) (log scale)"), "100x in x");
        assert!(!wide.contains("cost ($) (log scale)"), "2x in y");
        assert!(!wide.contains("cheapest meeting them"), "none chosen");
    }
}
