//! Unit tests of qsim_results through its public API (moved here from the
//! crate so the workspace has one test binary fewer).

mod read {
    use qsim_results::read::*;
    use qsim_results::table::{write_table, NamedColumn, Values};

    #[test]
    fn reads_a_column_from_each_format() {
        let d = tempfile::tempdir().unwrap();
        let (pq, csv) = write_table(
            &d.path().join("t"),
            &[
                NamedColumn::new(
                    "prompt",
                    Values::Str(vec![Some("hi, there".into()), Some("two\nlines".into())]),
                ),
                NamedColumn::new("n", Values::I64(vec![Some(1), Some(20)])),
            ],
        )
        .unwrap();
        let want = ["hi, there", "two\nlines"];
        assert_eq!(
            read_column(&pq, "prompt", &qsim_sim::input::load_data).unwrap(),
            want
        );
        assert_eq!(
            read_column(&csv, "prompt", &qsim_sim::input::load_data).unwrap(),
            want
        );
        assert_eq!(
            read_column(&pq, "n", &qsim_sim::input::load_data).unwrap(),
            ["1", "20"]
        );
        assert_eq!(
            read_column(&csv, "n", &qsim_sim::input::load_data).unwrap(),
            ["1", "20"]
        );
        let jl = d.path().join("t.jsonl");
        std::fs::write(
            &jl,
            "{\"prompt\": \"hi, there\", \"n\": 1}\n\n{\"prompt\": \"two\\nlines\", \"n\": 20}\n",
        )
        .unwrap();
        assert_eq!(
            read_column(&jl, "prompt", &qsim_sim::input::load_data).unwrap(),
            want
        );
        assert_eq!(
            read_column(&jl, "n", &qsim_sim::input::load_data).unwrap(),
            ["1", "20"]
        );
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let (pq, csv) = write_table(
            &d.path().join("t"),
            &[NamedColumn::new(
                "a",
                Values::Str(vec![Some("x".into()), None]),
            )],
        )
        .unwrap();
        let e = read_column(&pq, "b", &qsim_sim::input::load_data)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.parquet") && e.contains("no column \"b\" (columns: a)"),
            "{e}"
        );
        let e = read_column(&csv, "a", &qsim_sim::input::load_data)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 2: no value"), "{e}");
        let jl = d.path().join("t.jsonl");
        std::fs::write(&jl, "{\"a\": 1}\nnot json\n").unwrap();
        let e = read_column(&jl, "a", &qsim_sim::input::load_data)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2: invalid JSON"), "{e}");
        let e = read_column(&d.path().join("t.txt"), "a", &qsim_sim::input::load_data)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown format"), "{e}");
        let e = read_column(&d.path().join("none.csv"), "a", &qsim_sim::input::load_data)
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.csv"), "{e}");
    }
}

mod results {
    use qsim_results::results::*;
    use qsim_results::*;

    fn axes() -> Vec<Axis> {
        vec![
            Axis {
                path: "workers".into(),
                values: vec!["8".into(), "16".into()],
            },
            Axis {
                path: "policy".into(),
                values: vec!["a".into(), "b".into(), "c".into()],
            },
        ]
    }

    #[test]
    fn point_params_follow_the_grid_order() {
        let a = axes();
        assert_eq!(grid_size(&a), 6);
        assert_eq!(point_params(&a, 0).unwrap(), ["8", "a"]);
        assert_eq!(point_params(&a, 2).unwrap(), ["8", "c"]);
        assert_eq!(point_params(&a, 3).unwrap(), ["16", "a"]);
        assert!(point_params(&a, 6).is_none());
        assert_eq!(point_params(&[], 0).unwrap(), Vec::<&str>::new());
    }

    #[test]
    fn summary_matches_the_text_reports() {
        let v: Vec<f64> = (0..=100).map(f64::from).collect();
        assert_eq!(summary(&v), (50.0, 50.0, 5.0, 95.0));
        assert_eq!(summary(&[3.0]), (3.0, 3.0, 3.0, 3.0));
        let (m, mean, lo, hi) = summary(&[4.0, 1.0, 2.0]);
        assert_eq!((m, mean), (2.0, 7.0 / 3.0));
        assert!((lo - 1.1).abs() < 1e-12 && (hi - 3.8).abs() < 1e-12);
    }

    #[test]
    fn runs_are_rows_and_metrics_columns() {
        let mut b = ResultsBuilder::new(axes());
        // pushed out of point order: rows come back in grid order
        b.push(3, 1, "exp", "ok", 5.0).unwrap();
        b.push(0, 1, "exp", "ok", 1.0).unwrap();
        b.push(0, 1, "exp", "p95", 2.0).unwrap();
        b.push(0, 2, "exp", "ok", 3.0).unwrap();
        assert!(b.push(0, 2, "exp", "ok", 3.0).is_err(), "recorded twice");
        assert!(b.push(6, 1, "exp", "ok", 3.0).is_err(), "outside the grid");
        let r = b.finish();
        assert_eq!(r.metric_names(), ["ok", "p95"]);
        let cols = r.runs_columns();
        let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["point", "workers", "policy", "seed", "subject", "ok", "p95"]
        );
        assert_eq!(cols[0].values, Values::U32(vec![Some(0), Some(0), Some(3)]));
        assert_eq!(
            cols[1].values,
            Values::I64(vec![Some(8), Some(8), Some(16)])
        );
        assert_eq!(
            cols[6].values,
            Values::F64(vec![Some(2.0), None, None]),
            "null where a run lacks the metric"
        );
        let p = r.points_columns();
        let metric = p.iter().find(|c| c.name == "metric").unwrap();
        assert_eq!(
            metric.values,
            Values::Str(vec![
                Some("ok".into()),
                Some("p95".into()),
                Some("ok".into())
            ])
        );
        let median = p.iter().find(|c| c.name == "median").unwrap();
        assert_eq!(
            median.values,
            Values::F64(vec![Some(2.0), Some(2.0), Some(5.0)])
        );
        let runs = p.iter().find(|c| c.name == "runs").unwrap();
        assert_eq!(runs.values, Values::U64(vec![Some(2), Some(1), Some(1)]));
    }

    #[test]
    fn parameters_are_typed_from_all_the_axis_values() {
        assert_eq!(param_type(&["8".into(), "16".into()]), ParamType::Int);
        assert_eq!(param_type(&["0.5".into(), "1".into()]), ParamType::Float);
        assert_eq!(param_type(&["1".into(), "full".into()]), ParamType::Text);
    }
}

mod table {
    use qsim_results::table::*;

    #[test]
    fn frame_checks_lengths_and_names() {
        let a = NamedColumn::new("a", Values::F64(vec![Some(1.0), None]));
        let b = NamedColumn::new("b", Values::Str(vec![Some("x".into())]));
        assert!(frame(&[a.clone(), b]).is_err());
        assert!(frame(&[a.clone(), a.clone()]).is_err());
        let df = frame(&[a]).unwrap();
        assert_eq!(df.height(), 2);
    }

    #[test]
    fn csv_has_header_nulls_and_quotes() {
        let enc = encode_table(&[
            NamedColumn::new("n", Values::U64(vec![Some(1), Some(2)])),
            NamedColumn::new("s", Values::Str(vec![Some("a,b".into()), None])),
            NamedColumn::new("x", Values::F64(vec![Some(0.5), None])),
        ])
        .unwrap();
        assert_eq!(
            String::from_utf8(enc.csv).unwrap(),
            "n,s,x\n1,\"a,b\",0.5\n2,,\n"
        );
        assert_eq!(&enc.parquet[..4], b"PAR1");
    }
}

mod manifest {
    use qsim_results::manifest::*;
    use qsim_results::*;

    #[test]
    fn sha256_of_abc() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn manifest_round_trips() {
        let m = Manifest {
            version: "0.1.0".into(),
            command: vec!["qsim".into(), "sweep".into()],
            inputs: vec![Input::new("a.toml", b"x")],
            seed: 1,
            seeds: 3,
            axes: vec![Axis {
                path: "workers".into(),
                values: vec!["8".into(), "16".into()],
            }],
            shard: Some((1, 2)),
            merged: vec![],
        };
        let text = m.to_json(&[("runs.csv".into(), b"a\n".to_vec())]);
        assert!(text.contains("\"points\": 2"), "{text}");
        assert_eq!(Manifest::parse("m", &text).unwrap(), m);
        assert!(Manifest::parse("m", "{}").is_err());
    }
}
