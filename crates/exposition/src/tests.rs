#![expect(
    clippy::float_cmp,
    reason = "a parsed value must be exactly the number written"
)]

use proptest::prelude::*;

use super::*;

fn labels(sample: &Sample) -> Vec<(&str, &str)> {
    sample
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[test]
fn label_values_keep_commas_braces_equals_and_escaped_quotes() {
    let sample = Sample::parse(
        r#"vllm:num_requests_running{model_name="a,b}c{d=e",path="C:\\dir\\\"x\"",msg="two\nlines",z=""} 3.5"#,
    )
    .unwrap();
    assert_eq!(sample.name, "vllm:num_requests_running");
    assert_eq!(
        labels(&sample),
        [
            ("model_name", "a,b}c{d=e"),
            ("path", r#"C:\dir\"x""#),
            ("msg", "two\nlines"),
            ("z", ""),
        ]
    );
    assert_eq!(sample.value, 3.5);
    assert_eq!(sample.timestamp, None);
}

#[test]
fn spaces_trailing_commas_timestamps_and_special_values() {
    let sample = Sample::parse(r#"x_total { a = "1" , b="2", } +Inf 1700000000000"#).unwrap();
    assert_eq!(labels(&sample), [("a", "1"), ("b", "2")]);
    assert_eq!(sample.value, f64::INFINITY);
    assert_eq!(sample.timestamp, Some(1.7e12));
    assert_eq!(Sample::parse("x -Inf").unwrap().value, f64::NEG_INFINITY);
    assert!(Sample::parse("x NaN").unwrap().value.is_nan());
    assert_eq!(Sample::parse("x{} 1e-3").unwrap().value, 0.001);
    // An OpenMetrics exemplar after the value is not part of the sample.
    let with_exemplar = Sample::parse(r#"x_bucket{le="1"} 4 # {trace_id="a"} 0.5 12"#).unwrap();
    assert_eq!(with_exemplar.value, 4.0);
}

#[test]
fn malformed_lines_name_what_is_wrong() {
    for (line, kind) in [
        ("", ErrorKind::Name),
        ("1up 1", ErrorKind::Name),
        ("up", ErrorKind::Value),
        ("up one", ErrorKind::Value),
        ("up 1 two", ErrorKind::Timestamp),
        ("up 1 2 3", ErrorKind::Trailing),
        (r#"up{a="1} 1"#, ErrorKind::Unclosed),
        (r#"up{a="1\"} 1"#, ErrorKind::Unclosed),
        (r#"up{a="\t"} 1"#, ErrorKind::Escape),
        (r#"up{a="1" b="2"} 1"#, ErrorKind::Labels),
        (r#"up{a="1" 1"#, ErrorKind::Labels),
        (r"up{a=1} 1", ErrorKind::LabelEquals),
        (r"up{a} 1", ErrorKind::LabelEquals),
        (r#"up{="1"} 1"#, ErrorKind::LabelName),
        (r#"up{1a="1"} 1"#, ErrorKind::LabelName),
    ] {
        assert_eq!(
            Sample::parse(line),
            Err(ParseError { line: 1, kind }),
            "{line:?}"
        );
    }
}

#[test]
fn comment_lines() {
    let lines = parse(
        "# HELP up Whether the target is up.\n\
         # TYPE up gauge\n\
         # UNIT up_seconds seconds\n\
         #  just a note\n\
         \n\
         up 1\n\
         # EOF\n",
    )
    .unwrap();
    assert_eq!(
        lines,
        [
            Line::Help {
                name: "up".into(),
                text: "Whether the target is up.".into()
            },
            Line::Type {
                name: "up".into(),
                kind: "gauge".into()
            },
            Line::Unit {
                name: "up_seconds".into(),
                unit: "seconds".into()
            },
            Line::Comment("just a note".into()),
            Line::Blank,
            Line::Sample(Sample::parse("up 1").unwrap()),
            Line::Eof,
        ]
    );
    assert_eq!(parse("up 1\n# TYPE up\n").unwrap_err().line, 2);
    assert_eq!(
        parse("# TYPE up gauge x\n").unwrap_err().kind,
        ErrorKind::Type
    );
    assert_eq!(parse("# HELP 1x text\n").unwrap_err().kind, ErrorKind::Name);
}

#[test]
fn lenient_reading_skips_what_it_cannot_read_and_sums_by_labels() {
    let samples = Samples::parse(
        "# HELP llamacpp:requests_processing Number of requests processing.\n\
         # TYPE llamacpp:requests_processing gauge\n\
         llamacpp:requests_processing 2\n\
         vllm:num_requests_running{engine=\"0\",model_name=\"q,1\"} 3.0\n\
         vllm:num_requests_running{engine=\"1\",model_name=\"q,1\"} 1.0\n\
         vllm:num_requests_running{engine=\"0\",model_name=\"other\"} 5.0\n\
         vllm:num_requests_running{model_name=\"broken} 7\n\
         garbage line\n",
    );
    assert_eq!(samples.iter().count(), 4);
    assert_eq!(samples.sum("llamacpp:requests_processing", &[]), Some(2.0));
    assert_eq!(
        samples.sum("vllm:num_requests_running", &[("model_name", "q,1")]),
        Some(4.0)
    );
    assert_eq!(samples.sum("vllm:num_requests_running", &[]), Some(9.0));
    assert_eq!(samples.sum("absent", &[]), None);
    assert_eq!(
        samples.value(r#"vllm:num_requests_running{model_name="other",engine="0"}"#),
        Some(5.0)
    );
    assert_eq!(samples.value("vllm:num_requests_running"), None);
    assert_eq!(samples.value(r"vllm:num_requests_running{"), None);
}

/// How an exposition writes a label value.
fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

proptest! {
    /// Whatever the label values hold, writing them escaped and reading them back gives them
    /// unchanged.
    #[test]
    fn any_escaped_label_value_reads_back(
        name in "[a-zA-Z_:][a-zA-Z0-9_:]{0,12}",
        pairs in proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,8}", any::<String>()), 0..4),
        value in any::<f64>().prop_filter("NaN never equals itself", |v| !v.is_nan()),
    ) {
        let body: Vec<String> =
            pairs.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let line = format!("{name}{{{}}} {value:?}", body.join(","));
        let sample = Sample::parse(&line).unwrap();
        prop_assert_eq!(&sample.name, &name);
        prop_assert_eq!(&sample.labels, &pairs);
        prop_assert_eq!(sample.value, value);
    }

    /// No input makes the parser panic.
    #[test]
    fn never_panics(text in any::<String>()) {
        let _ = parse(&text);
        let _ = Samples::parse(&text).value(&text);
    }
}
