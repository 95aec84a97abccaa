//! # slotgate-exposition
//!
//! Reads the text format in which Prometheus metrics are exposed: the Prometheus text format
//! 0.0.4 that the engines serve on `/metrics` (llama-server's `llamacpp:*`, vLLM's `vllm:*`),
//! and the `OpenMetrics` text format that the gateway's own admin listener serves. It is the one
//! parser of the workspace: the gateway reads engine gauges with it, and the tests read the
//! gateway's `/metrics` with it.
//!
//! A line is a [`Line`]: a [`Sample`] (`name{label="value",…} value [timestamp]`), a `# HELP`,
//! `# TYPE` or `# UNIT` line, the `OpenMetrics` `# EOF`, another comment, or a blank line. Label
//! values are unescaped (`\\`, `\"`, `\n`), and a value may hold any character, including `,`,
//! `{`, `}`, `=` and an escaped quote: the label list is read character by character, never split.
//!
//! Two ways to read a whole text:
//!
//! - [`parse`] is strict: the first line that is not one of the above is an error naming it
//!   (for tests that check an exposition is well formed).
//! - [`Samples::parse`] is lenient: it keeps every sample line it can read and skips the rest, so
//!   one odd line of an engine's exposition (a new build, an exemplar) does not hide the gauges
//!   around it.
//!
//! ```
//! use slotgate_exposition::Samples;
//!
//! let text = "# TYPE vllm:num_requests_running gauge\n\
//!             vllm:num_requests_running{model_name=\"a,b\"} 3\n\
//!             vllm:num_requests_running{model_name=\"c\"} 1\n";
//! let samples = Samples::parse(text);
//! assert_eq!(samples.sum("vllm:num_requests_running", &[]), Some(4.0));
//! assert_eq!(samples.sum("vllm:num_requests_running", &[("model_name", "a,b")]), Some(3.0));
//! assert_eq!(samples.value(r#"vllm:num_requests_running{model_name="c"}"#), Some(1.0));
//! ```
//!
//! Not covered, because nothing here needs them: the protobuf format, and checking that the
//! samples of a family follow its `# TYPE` line (the caller sees the lines in order and can).
//!
//! # Why a crate of our own
//!
//! The parsers on crates.io did not fit (checked 2026-12): `prometheus-parse` reads names with
//! `\w+` (no `:`, so no `vllm:*` or `llamacpp:*` series) and labels with `[^}]+` (a `}` inside a
//! value breaks it), and has had no release since 2023; `openmetrics-parser` is LGPL-3.0, which
//! `deny.toml` does not allow; `prom_text_format_parser` and `nom-openmetrics` are single-author
//! releases whose dependencies (`derive_more` 0.99 on syn 1, a second `strum`, `nom`) would add
//! duplicate versions for what is one small grammar. This one has no dependency besides
//! `thiserror`, and a property test for label values.

#[cfg(test)]
mod tests;

/// One sample: a series (name and labels) and its value.
///
/// ```
/// use slotgate_exposition::Sample;
///
/// let sample = Sample::parse(r#"up{job="a \"b\""} 1 1700000000000"#).unwrap();
/// assert_eq!(sample.name, "up");
/// assert_eq!(sample.label("job"), Some(r#"a "b""#));
/// assert_eq!(sample.value, 1.0);
/// assert_eq!(sample.timestamp, Some(1.7e12));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Sample {
    /// The metric name, for example `vllm:num_requests_running` or `slotgate_requests_total`.
    pub name: String,
    /// The labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value; `+Inf`, `-Inf` and `NaN` included.
    pub value: f64,
    /// The timestamp after the value, if any (milliseconds in the Prometheus format, seconds in
    /// `OpenMetrics`; kept as written).
    pub timestamp: Option<f64>,
}

impl Sample {
    /// Reads one sample line.
    ///
    /// # Errors
    ///
    /// A [`ParseError`] naming what is wrong, with the line number 1.
    ///
    /// ```
    /// use slotgate_exposition::Sample;
    ///
    /// assert!(Sample::parse("no_value").is_err());
    /// assert_eq!(Sample::parse("a_total 2").unwrap().value, 2.0);
    /// ```
    pub fn parse(line: &str) -> Result<Self, ParseError> {
        let mut reader = Reader::new(line);
        let sample = reader
            .sample()
            .map_err(|kind| ParseError { line: 1, kind })?;
        Ok(sample)
    }

    /// The value of the label `name`, if the sample has it.
    ///
    /// ```
    /// use slotgate_exposition::Sample;
    ///
    /// let sample = Sample::parse(r#"x{a="1"} 0"#).unwrap();
    /// assert_eq!(sample.label("a"), Some("1"));
    /// assert_eq!(sample.label("b"), None);
    /// ```
    #[must_use]
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the sample carries every pair of `labels` (it may have more).
    ///
    /// ```
    /// use slotgate_exposition::Sample;
    ///
    /// let sample = Sample::parse(r#"x{a="1",b="2"} 0"#).unwrap();
    /// assert!(sample.has_labels(&[("b", "2")]));
    /// assert!(!sample.has_labels(&[("b", "3")]));
    /// ```
    #[must_use]
    pub fn has_labels(&self, labels: &[(&str, &str)]) -> bool {
        labels.iter().all(|(k, v)| self.label(k) == Some(*v))
    }

    /// Whether the sample is the series `name` with exactly `labels`, in any order.
    ///
    /// ```
    /// use slotgate_exposition::Sample;
    ///
    /// let sample = Sample::parse(r#"x{a="1",b="2"} 0"#).unwrap();
    /// assert!(sample.is_series("x", &[("b", "2"), ("a", "1")]));
    /// assert!(!sample.is_series("x", &[("a", "1")]));
    /// ```
    #[must_use]
    pub fn is_series(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.name == name && self.labels.len() == labels.len() && self.has_labels(labels)
    }
}

/// One line of an exposition.
///
/// ```
/// use slotgate_exposition::Line;
///
/// assert_eq!(
///     Line::parse("# TYPE up gauge").unwrap(),
///     Line::Type { name: "up".into(), kind: "gauge".into() }
/// );
/// assert_eq!(Line::parse("# EOF").unwrap(), Line::Eof);
/// assert!(matches!(Line::parse("up 1").unwrap(), Line::Sample(_)));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Line {
    /// A sample.
    Sample(Sample),
    /// `# HELP name text`.
    Help {
        /// The family.
        name: String,
        /// The help text as written.
        text: String,
    },
    /// `# TYPE name kind`.
    Type {
        /// The family.
        name: String,
        /// `counter`, `gauge`, `histogram`, … as written.
        kind: String,
    },
    /// `# UNIT name unit` (`OpenMetrics`).
    Unit {
        /// The family.
        name: String,
        /// The unit as written.
        unit: String,
    },
    /// `# EOF`, the end of an `OpenMetrics` exposition.
    Eof,
    /// Any other comment, without its `#`.
    Comment(String),
    /// An empty or all-blank line.
    Blank,
}

impl Line {
    /// Reads one line (without its line break).
    ///
    /// # Errors
    ///
    /// A [`ParseError`] with the line number 1 when the line is none of the kinds of [`Line`].
    ///
    /// ```
    /// use slotgate_exposition::Line;
    ///
    /// assert!(Line::parse("# HELP").is_err());
    /// assert_eq!(Line::parse("  ").unwrap(), Line::Blank);
    /// ```
    pub fn parse(line: &str) -> Result<Self, ParseError> {
        Self::read(line).map_err(|kind| ParseError { line: 1, kind })
    }

    fn read(line: &str) -> Result<Self, ErrorKind> {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return Ok(Line::Blank);
        }
        let Some(comment) = trimmed.strip_prefix('#') else {
            return Reader::new(line).sample().map(Line::Sample);
        };
        let comment = comment.trim_start();
        if comment == "EOF" {
            return Ok(Line::Eof);
        }
        let mut words = comment.splitn(3, char::is_whitespace);
        let keyword = words.next().unwrap_or_default();
        if !matches!(keyword, "HELP" | "TYPE" | "UNIT") {
            return Ok(Line::Comment(comment.to_owned()));
        }
        let name = words.next().unwrap_or_default();
        if !is_metric_name(name) {
            return Err(ErrorKind::Name);
        }
        let rest = words.next().unwrap_or_default().trim();
        let name = name.to_owned();
        Ok(match keyword {
            "HELP" => Line::Help {
                name,
                text: rest.to_owned(),
            },
            "TYPE" if rest.is_empty() || rest.contains(char::is_whitespace) => {
                return Err(ErrorKind::Type);
            }
            "TYPE" => Line::Type {
                name,
                kind: rest.to_owned(),
            },
            _ => Line::Unit {
                name,
                unit: rest.to_owned(),
            },
        })
    }
}

/// Reads every line of `text`, strictly.
///
/// # Errors
///
/// The first line that is not a [`Line`], with its number (from 1).
///
/// ```
/// use slotgate_exposition::{parse, Line};
///
/// let lines = parse("# TYPE up gauge\nup 1\n# EOF\n").unwrap();
/// assert_eq!(lines.len(), 3);
/// assert_eq!(lines[2], Line::Eof);
/// assert_eq!(parse("up 1\nup{ 1\n").unwrap_err().line, 2);
/// ```
pub fn parse(text: &str) -> Result<Vec<Line>, ParseError> {
    text.lines()
        .enumerate()
        .map(|(i, line)| Line::read(line).map_err(|kind| ParseError { line: i + 1, kind }))
        .collect()
}

/// The samples of an exposition, read leniently (see the crate docs).
///
/// ```
/// use slotgate_exposition::Samples;
///
/// let samples = Samples::parse("a 1\nnot a sample\nb{x=\"}\"} 2\n");
/// assert_eq!(samples.iter().count(), 2);
/// assert_eq!(samples.sum("b", &[("x", "}")]), Some(2.0));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Samples {
    samples: Vec<Sample>,
}

impl Samples {
    /// Reads every sample line of `text`; comments and lines that are not samples are skipped.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter_map(|line| match Line::read(line) {
                Ok(Line::Sample(sample)) => Some(sample),
                _ => None,
            })
            .collect();
        Self { samples }
    }

    /// Every sample, in the order written.
    pub fn iter(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter()
    }

    /// The sum of every sample named `name` that carries all of `labels` (every sample of that
    /// name when `labels` is empty); `None` when no sample matches.
    ///
    /// ```
    /// use slotgate_exposition::Samples;
    ///
    /// let samples = Samples::parse("q{m=\"a\"} 1\nq{m=\"a\",e=\"1\"} 2\nq{m=\"b\"} 4\n");
    /// assert_eq!(samples.sum("q", &[("m", "a")]), Some(3.0));
    /// assert_eq!(samples.sum("q", &[("m", "c")]), None);
    /// ```
    #[must_use]
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .filter(|s| s.name == name && s.has_labels(labels))
            .map(|s| s.value)
            .reduce(|a, b| a + b)
    }

    /// The value of one series, written as in an exposition (`name` or `name{a="x",…}`, labels
    /// in any order, all of them); `None` when it is absent or `series` cannot be read.
    ///
    /// ```
    /// use slotgate_exposition::Samples;
    ///
    /// let samples = Samples::parse("up{a=\"1\",b=\"2\"} 1\nup{a=\"1\"} 0\n");
    /// assert_eq!(samples.value(r#"up{b="2",a="1"}"#), Some(1.0));
    /// assert_eq!(samples.value(r#"up{a="1"}"#), Some(0.0));
    /// assert_eq!(samples.value("up"), None);
    /// ```
    #[must_use]
    pub fn value(&self, series: &str) -> Option<f64> {
        let mut reader = Reader::new(series);
        let (name, labels) = reader.series().ok()?;
        reader.skip_blanks();
        if !reader.at_end() {
            return None;
        }
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.is_series(&name, &labels))
            .map(|s| s.value)
    }
}

/// A line that is not part of the exposition format.
///
/// ```
/// use slotgate_exposition::Sample;
///
/// let error = Sample::parse(r#"up{a="1} 1"#).unwrap_err();
/// assert_eq!(error.to_string(), "line 1: a label value has no closing quote");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {kind}")]
#[non_exhaustive]
pub struct ParseError {
    /// The line number, from 1.
    pub line: usize,
    /// What is wrong with it.
    pub kind: ErrorKind,
}

/// What is wrong with a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The metric name is missing or has a character a name may not have.
    #[error("not a metric name")]
    Name,
    /// A label name is missing or has a character a label name may not have.
    #[error("not a label name")]
    LabelName,
    /// A label name is not followed by `="`.
    #[error("a label name is not followed by =\"")]
    LabelEquals,
    /// A label value has no closing quote.
    #[error("a label value has no closing quote")]
    Unclosed,
    /// A label value has a backslash not followed by `\`, `"` or `n`.
    #[error("a label value has an unknown escape")]
    Escape,
    /// The label list is not closed by `}`, or two labels are not separated by `,`.
    #[error("the label list is not closed")]
    Labels,
    /// The value is missing or not a number.
    #[error("no value, or the value is not a number")]
    Value,
    /// The timestamp is not a number.
    #[error("the timestamp is not a number")]
    Timestamp,
    /// Something follows the timestamp.
    #[error("unexpected text after the value")]
    Trailing,
    /// A `# TYPE` line without exactly one type word.
    #[error("a TYPE line needs exactly one type")]
    Type,
}

/// Whether `name` is a metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A cursor over one line.
struct Reader<'a> {
    rest: &'a str,
}

impl<'a> Reader<'a> {
    fn new(line: &'a str) -> Self {
        Self { rest: line }
    }

    fn at_end(&self) -> bool {
        self.rest.is_empty()
    }

    fn skip_blanks(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t']);
    }

    fn eat(&mut self, c: char) -> bool {
        if let Some(rest) = self.rest.strip_prefix(c) {
            self.rest = rest;
            true
        } else {
            false
        }
    }

    /// The longest prefix of name characters (`:` allowed when `colon`).
    fn word(&mut self, colon: bool) -> &'a str {
        let end = self
            .rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':')))
            .unwrap_or(self.rest.len());
        let (word, rest) = self.rest.split_at(end);
        self.rest = rest;
        word
    }

    /// The next run of non-blank characters.
    fn token(&mut self) -> &'a str {
        self.skip_blanks();
        let end = self.rest.find([' ', '\t']).unwrap_or(self.rest.len());
        let (token, rest) = self.rest.split_at(end);
        self.rest = rest;
        token
    }

    /// `name` or `name{labels}`.
    fn series(&mut self) -> Result<(String, Vec<(String, String)>), ErrorKind> {
        self.skip_blanks();
        let name = self.word(true);
        if !is_metric_name(name) {
            return Err(ErrorKind::Name);
        }
        self.skip_blanks();
        let labels = if self.eat('{') {
            self.labels()?
        } else {
            Vec::new()
        };
        Ok((name.to_owned(), labels))
    }

    /// The label list after `{`, through its `}`. A trailing comma is allowed, as Prometheus
    /// itself accepts it.
    fn labels(&mut self) -> Result<Vec<(String, String)>, ErrorKind> {
        let mut labels = Vec::new();
        loop {
            self.skip_blanks();
            if self.eat('}') {
                return Ok(labels);
            }
            let name = self.word(false);
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(ErrorKind::LabelName);
            }
            self.skip_blanks();
            if !self.eat('=') {
                return Err(ErrorKind::LabelEquals);
            }
            self.skip_blanks();
            if !self.eat('"') {
                return Err(ErrorKind::LabelEquals);
            }
            let value = self.quoted()?;
            labels.push((name.to_owned(), value));
            self.skip_blanks();
            if self.eat(',') {
                continue;
            }
            if self.eat('}') {
                return Ok(labels);
            }
            return Err(ErrorKind::Labels);
        }
    }

    /// A label value after its opening quote, through the closing one, unescaped.
    fn quoted(&mut self) -> Result<String, ErrorKind> {
        let mut value = String::new();
        let mut chars = self.rest.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &self.rest[i + 1..];
                    return Ok(value);
                }
                '\\' => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    Some(_) => return Err(ErrorKind::Escape),
                    None => return Err(ErrorKind::Unclosed),
                },
                c => value.push(c),
            }
        }
        Err(ErrorKind::Unclosed)
    }

    /// A whole sample line.
    fn sample(&mut self) -> Result<Sample, ErrorKind> {
        let (name, labels) = self.series()?;
        let value = parse_number(self.token()).ok_or(ErrorKind::Value)?;
        let timestamp = match self.token() {
            "" => None,
            // An OpenMetrics exemplar (`# {…} value`) may follow the value directly.
            "#" => {
                self.rest = "";
                None
            }
            t => Some(parse_number(t).ok_or(ErrorKind::Timestamp)?),
        };
        match self.token() {
            "" => {}
            "#" => self.rest = "",
            _ => return Err(ErrorKind::Trailing),
        }
        Ok(Sample {
            name,
            labels,
            value,
            timestamp,
        })
    }
}

/// A number as the formats write it: Go's float syntax, `+Inf`, `-Inf`, `NaN`.
fn parse_number(token: &str) -> Option<f64> {
    if token.is_empty() {
        return None;
    }
    token.parse().ok()
}
