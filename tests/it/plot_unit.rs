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
