//! A strict reader of the Prometheus text exposition format (version 0.0.4), for tests
//! of `lamina daemon --metrics-address`: what Prometheus would refuse, it refuses, so a
//! test that scrapes through it also proves the page is well formed.
//!
//! Checked: every line is a `# HELP`, a `# TYPE`, another comment, blank, or a sample;
//! names and label names are valid; label values are quoted with only `\\`, `\"` and
//! `\n` escaped; values are floats (`NaN`, `+Inf`, `-Inf` too); a family's `TYPE` comes
//! once and before its samples, and its lines are one group; no series repeats; a
//! counter or a histogram's samples carry its suffixes; a histogram's buckets have `le`,
//! rise with it, end at `+Inf`, and that bucket equals its `_count`.

use std::collections::{BTreeMap, HashSet};

/// One sample line: its name as written (with any `_bucket`, `_sum`, `_count` suffix).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One family: what `# TYPE` declared it, and its samples in order.
#[derive(Debug, Clone, Default)]
pub struct Family {
    pub kind: String,
    pub help: Option<String>,
    pub samples: Vec<Sample>,
}

/// A parsed page, by family name.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub families: BTreeMap<String, Family>,
}

impl Exposition {
    /// The value of the series `name` with exactly `labels`, if there is one.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples(name)
            .find(|s| s.name == name && s.labels == wanted)
            .map(|s| s.value)
    }

    /// The sum of every series `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name)
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Every sample named `name`, in whichever family holds it.
    pub fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.families
            .iter()
            .filter(move |(family, _)| name.starts_with(family.as_str()))
            .flat_map(|(_, f)| f.samples.iter())
            .filter(move |s| s.name == name)
    }

    /// The family `name`, if declared.
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.get(name)
    }
}

/// Parses `text`, or says which line breaks the format and why.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut page = Exposition::default();
    let mut seen = HashSet::new();
    // Families whose group of lines has ended: one that shows up again is split.
    let mut closed: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    for (number, line) in text.split('\n').enumerate() {
        let at = |why: String| format!("line {}: {why}: `{line}`", number + 1);
        if line.is_empty() {
            continue;
        }
        let family_name = if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start_matches(' ');
            let (keyword, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            if keyword != "HELP" && keyword != "TYPE" {
                continue; // a comment
            }
            let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
            if !valid_name(name) {
                return Err(at(format!("`{name}` is not a metric name")));
            }
            let family = page.families.entry(name.to_string()).or_default();
            if keyword == "HELP" {
                if family.help.is_some() {
                    return Err(at("a second HELP".into()));
                }
                family.help = Some(unescape_help(value).map_err(at)?);
            } else {
                if !family.kind.is_empty() {
                    return Err(at("a second TYPE".into()));
                }
                if !family.samples.is_empty() {
                    return Err(at("TYPE after the family's samples".into()));
                }
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&value) {
                    return Err(at(format!("unknown type `{value}`")));
                }
                family.kind = value.to_string();
            }
            name.to_string()
        } else {
            let sample = parse_sample(line).map_err(at)?;
            let family = family_of(&page, &sample.name);
            let key = (sample.name.clone(), format!("{:?}", sample.labels));
            if !seen.insert(key) {
                return Err(at("a series repeated".into()));
            }
            let entry = page.families.entry(family.clone()).or_default();
            if entry.kind.is_empty() {
                entry.kind = "untyped".into();
            }
            check_suffix(&entry.kind, &family, &sample).map_err(at)?;
            entry.samples.push(sample);
            family
        };
        if current.as_deref() != Some(family_name.as_str()) {
            if closed.contains(&family_name) {
                return Err(at(format!("`{family_name}`'s lines are not one group")));
            }
            if let Some(previous) = current.replace(family_name) {
                closed.insert(previous);
            }
        }
    }
    for (name, family) in &page.families {
        if family.kind == "histogram" {
            check_histogram(name, family)?;
        }
    }
    Ok(page)
}

/// The family a sample belongs to: the declared family its name is, or is with a
/// histogram's or summary's suffix taken off.
fn family_of(page: &Exposition, name: &str) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && page
                .families
                .get(base)
                .is_some_and(|f| f.kind == "histogram" || f.kind == "summary")
        {
            return base.to_string();
        }
    }
    name.to_string()
}

fn check_suffix(kind: &str, family: &str, sample: &Sample) -> Result<(), String> {
    match kind {
        "counter" if !family.ends_with("_total") => {
            Err(format!("counter `{family}` does not end in _total"))
        }
        "counter" | "gauge" if sample.value.is_nan() => Err("a NaN count".into()),
        "counter" if sample.value < 0.0 => Err("a negative counter".into()),
        "histogram" if sample.name == family => Err("a histogram sample without suffix".into()),
        "histogram" if sample.name.ends_with("_bucket") && !sample.labels.contains_key("le") => {
            Err("a bucket without `le`".into())
        }
        _ => Ok(()),
    }
}

/// One histogram series: its buckets (`le`, count), `_sum`, `_count`.
type Series = (Vec<(f64, f64)>, Option<f64>, Option<f64>);

/// Each series of a histogram (its labels but `le`): buckets rising with `le`, the last
/// `+Inf`, equal to `_count`; a `_sum` beside it.
fn check_histogram(name: &str, family: &Family) -> Result<(), String> {
    let mut series: BTreeMap<String, Series> = BTreeMap::new();
    for sample in &family.samples {
        let mut labels = sample.labels.clone();
        let le = labels.remove("le");
        let entry = series.entry(format!("{labels:?}")).or_default();
        match sample.name.strip_prefix(name) {
            Some("_bucket") => {
                let le = le.ok_or_else(|| format!("{name}: a bucket without `le`"))?;
                let bound = parse_value(&le).map_err(|e| format!("{name}: le `{le}`: {e}"))?;
                entry.0.push((bound, sample.value));
            }
            Some("_sum") => entry.1 = Some(sample.value),
            Some("_count") => entry.2 = Some(sample.value),
            _ => return Err(format!("{name}: sample `{}` is not its", sample.name)),
        }
    }
    for (labels, (buckets, sum, count)) in series {
        let at = |why: &str| format!("histogram {name}{labels}: {why}");
        if !buckets
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        {
            return Err(at("buckets do not rise with `le`"));
        }
        let Some(&(last, in_last)) = buckets.last() else {
            return Err(at("no buckets"));
        };
        if last != f64::INFINITY {
            return Err(at("no `+Inf` bucket"));
        }
        if sum.is_none() {
            return Err(at("no `_sum`"));
        }
        if count != Some(in_last) {
            return Err(at("`_count` is not the `+Inf` bucket"));
        }
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => {
            let plain = text.bytes().all(|b| b"0123456789+-.eE".contains(&b));
            match text.parse::<f64>() {
                Ok(v) if plain && v.is_finite() => Ok(v),
                _ => Err(format!("`{text}` is not a value")),
            }
        }
    }
}

/// `name{label="value",...} value [timestamp]`
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| "a sample without a value".to_string())?;
    let name = &line[..name_end];
    if !valid_name(name) {
        return Err(format!("`{name}` is not a metric name"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        loop {
            // A label name up to `=`, or the end of the set.
            let start = match chars.peek() {
                Some((_, '}')) => {
                    let (i, _) = chars.next().unwrap_or((0, '}'));
                    rest = &body[i + 1..];
                    break;
                }
                Some((i, _)) => *i,
                None => return Err("labels not closed".into()),
            };
            let eq = body[start..]
                .find('=')
                .ok_or_else(|| "a label without `=`".to_string())?;
            let label = &body[start..start + eq];
            if !valid_label_name(label) {
                return Err(format!("`{label}` is not a label name"));
            }
            while chars.peek().is_some_and(|(i, _)| *i <= start + eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label `{label}`'s value is not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '"')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => return Err(format!("a bad escape `\\{other:?}`")),
                    },
                    Some((_, '\n')) | None => return Err("a label value not closed".into()),
                    Some((_, c)) => value.push(c),
                }
            }
            if labels.insert(label.to_string(), value).is_some() {
                return Err(format!("label `{label}` twice"));
            }
            match chars.peek() {
                Some((_, ',')) => {
                    chars.next();
                }
                Some((_, '}')) => {}
                _ => return Err("labels not separated by `,`".into()),
            }
        }
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_string())?;
    let mut fields = rest.split(' ');
    let value = parse_value(fields.next().unwrap_or(""))?;
    if let Some(timestamp) = fields.next()
        && timestamp.parse::<i64>().is_err()
    {
        return Err(format!("`{timestamp}` is not a timestamp"));
    }
    if fields.next().is_some() {
        return Err("more than a value and a timestamp".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// HELP text, with its `\\` and `\n` escapes undone.
fn unescape_help(text: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            other => return Err(format!("a bad escape in HELP `\\{other:?}`")),
        }
    }
    Ok(out)
}

/// `GET http://ADDRESS/metrics`, checked for status and content type, and parsed.
pub fn scrape(address: &str) -> Exposition {
    let url = format!("http://{address}/metrics");
    let response = ureq::get(&url)
        .config()
        .http_status_as_error(false)
        // A daemon that stops answering fails the test instead of hanging it.
        .timeout_global(Some(std::time::Duration::from_secs(60)))
        .build()
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response
        .into_body()
        .read_to_string()
        .unwrap_or_else(|e| panic!("GET {url}: reading the body: {e}"));
    assert_eq!(status, 200, "GET {url}: {body}");
    assert_eq!(
        content_type, "text/plain; version=0.0.4; charset=utf-8",
        "GET {url}: the text format's content type"
    );
    parse(&body).unwrap_or_else(|e| panic!("GET {url}: not the text format: {e}\n{body}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_page_parses_and_bad_ones_do_not() {
        let good = "# HELP a_total Things, \\\\ and \\n.\n# TYPE a_total counter\n\
                    a_total{k=\"v \\\"q\\\" \\\\ \\n\",j=\"\"} 3\n\
                    # TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\n\
                    h_sum 0.7\nh_count 2\n# a comment\nu 1.5e3 1700000000000\n";
        let page = parse(good).unwrap();
        assert_eq!(
            page.value("a_total", &[("k", "v \"q\" \\ \n"), ("j", "")]),
            Some(3.0)
        );
        assert_eq!(page.value("h_count", &[]), Some(2.0));
        assert_eq!(page.family("u").unwrap().kind, "untyped");
        for bad in [
            "a 1 2 3\n",
            "a{k=v} 1\n",
            "a{k=\"v\" 1\n",
            "a{1k=\"v\"} 1\n",
            "a{k=\"\\x\"} 1\n",
            "a one\n",
            "a 1\na 2\n",
            "# TYPE a counter\na 1\n",
            "# TYPE a_total counter\na_total -1\n",
            "a 1\n# TYPE a gauge\n",
            "# TYPE a gauge\n# TYPE a gauge\n",
            "a 1\nb 1\na{x=\"y\"} 1\n",
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
            "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n",
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n",
        ] {
            assert!(parse(bad).is_err(), "accepted: {bad:?}");
        }
    }
}
