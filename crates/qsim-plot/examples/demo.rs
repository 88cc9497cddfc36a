use qsim_plot::*;
fn main() {
    let out = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    let s = |n: &str, k: f64| Series { name: n.into(), points: (1..=8).map(|i| (i as f64 * 8.0, k * i as f64)).collect(), band: (1..=8).map(|i| (i as f64 * 8.0, k * i as f64 * 0.8, k * i as f64 * 1.2)).collect() };
    let f = metric_lines(LineChart { title: "elapsed vs workers".into(), x_label: "workers".into(), y_label: "elapsed (s)".into(), x_axis: XAxis::Log, series: vec![s("a", 1.0), s("b", 2.0)], ..Default::default() });
    f.save(&out.join("lines.svg")).unwrap(); f.save(&out.join("lines.png")).unwrap();
    let h = heatmap(Heatmap { title: "elapsed".into(), x_label: "workers".into(), y_label: "max_tokens".into(), value_label: "elapsed (s)".into(), x_values: vec!["4".into(),"8".into(),"16".into()], y_values: vec!["128".into(),"256".into()], cells: vec![vec![Some(1.0),Some(2.0),None], vec![Some(3.0),Some(4.0),Some(5.0)]], decimals: 1 });
    h.save(&out.join("heat.svg")).unwrap(); h.save(&out.join("heat.png")).unwrap();
    let p = plan_minutes("plan", "requests", 1000.0, &[PlanScenario { name: "s1".into(), consumers: vec![PlanConsumer { name: "A".into(), admitted_per_min: vec![500.0, 600.0, 700.0], band: vec![], floor: Some(400.0) }, PlanConsumer { name: "B".into(), admitted_per_min: vec![300.0, 300.0, 200.0], band: vec![], floor: None }] }]);
    p.save(&out.join("plan.svg")).unwrap(); p.save(&out.join("plan.png")).unwrap();
    let pp = pareto("pareto", "elapsed (s)", "p95 (s)", (0..20).map(|i| ParetoPoint { label: format!("c{i}"), x: 10.0 + (i * 7 % 13) as f64, y: 5.0 + (i * 5 % 11) as f64 }).collect());
    pp.save(&out.join("pareto.svg")).unwrap(); pp.save(&out.join("pareto.png")).unwrap();
}
