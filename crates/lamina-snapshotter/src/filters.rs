//! containerd's filter syntax, as snapshot `List` (Walk) receives it: a request carries
//! several filters, any of which may match (OR); a filter is selectors joined by `,`, all
//! of which must match (AND). A selector is a field path, optionally an operator (`==`,
//! `!=`, `~=`) and a value:
//!
//! ```text
//! name==foo
//! labels."containerd.io/snapshot.ref"==sha256:…,parent=="default/3/sha256:…"
//! labels.gc
//! kind!=committed
//! ```
//!
//! A field path alone matches when the field is present and non-empty. Values are bare
//! (anything but whitespace and `,`) or double-quoted. containerd itself uses this to find
//! the committed snapshot behind an `AlreadyExists` answer, so it must be exact.

/// What a filter can ask about a snapshot.
pub trait Fields {
    /// The value at `path` (`name`, `parent`, `kind`, `labels.<key>`), if it has one.
    fn field(&self, path: &[String]) -> Option<String>;
}

/// Parsed filters: matches when any of them matches, or when there are none.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    any_of: Vec<Vec<Selector>>,
}

#[derive(Debug, Clone)]
struct Selector {
    path: Vec<String>,
    op: Option<(Op, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equal,
    NotEqual,
    /// Substring match: a stand-in for containerd's regular expressions, which lamina does
    /// not need and does not pull a regex engine in for. Refused unless the value is a
    /// plain string.
    Matches,
}

impl Filters {
    pub fn parse(filters: &[String]) -> Result<Filters, String> {
        let any_of = filters
            .iter()
            .filter(|f| !f.trim().is_empty())
            .map(|f| parse_filter(f).map_err(|why| format!("filter `{f}`: {why}")))
            .collect::<Result<_, _>>()?;
        Ok(Filters { any_of })
    }

    pub fn matches(&self, item: &dyn Fields) -> bool {
        self.any_of.is_empty()
            || self
                .any_of
                .iter()
                .any(|all| all.iter().all(|s| s.matches(item)))
    }
}

impl Selector {
    fn matches(&self, item: &dyn Fields) -> bool {
        let value = item.field(&self.path);
        match &self.op {
            None => value.is_some_and(|v| !v.is_empty()),
            Some((Op::Equal, want)) => value.as_deref() == Some(want.as_str()),
            Some((Op::NotEqual, want)) => value.as_deref() != Some(want.as_str()),
            Some((Op::Matches, want)) => value.is_some_and(|v| v.contains(want.as_str())),
        }
    }
}

fn parse_filter(text: &str) -> Result<Vec<Selector>, String> {
    let mut lexer = Lexer {
        chars: text.chars().collect(),
        at: 0,
    };
    let mut selectors = Vec::new();
    loop {
        selectors.push(parse_selector(&mut lexer)?);
        lexer.skip_space();
        match lexer.next() {
            None => return Ok(selectors),
            Some(',') => continue,
            Some(c) => return Err(format!("unexpected `{c}` at {}", lexer.at - 1)),
        }
    }
}

fn parse_selector(lexer: &mut Lexer) -> Result<Selector, String> {
    let mut path = vec![lexer.field()?];
    while lexer.peek() == Some('.') {
        lexer.at += 1;
        path.push(lexer.field()?);
    }
    lexer.skip_space();
    let op = match (lexer.peek(), lexer.peek_at(1)) {
        (Some('='), Some('=')) => Some(Op::Equal),
        (Some('!'), Some('=')) => Some(Op::NotEqual),
        (Some('~'), Some('=')) => Some(Op::Matches),
        _ => None,
    };
    let Some(op) = op else {
        return Ok(Selector { path, op: None });
    };
    lexer.at += 2;
    lexer.skip_space();
    let value = lexer.value()?;
    if op == Op::Matches && value.chars().any(|c| "^$.*+?()[]{}|\\".contains(c)) {
        return Err(format!(
            "`~=` supports plain substrings only, not the regular expression `{value}`"
        ));
    }
    Ok(Selector {
        path,
        op: Some((op, value)),
    })
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
}

impl Lexer {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn peek_at(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        self.at += usize::from(c.is_some());
        c
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    /// A field name: quoted, or letters, digits and `_` (and `-`, which label keys use).
    fn field(&mut self) -> Result<String, String> {
        self.skip_space();
        if self.peek() == Some('"') {
            return self.quoted();
        }
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            self.at += 1;
        }
        if start == self.at {
            return Err(format!("expected a field name at {start}"));
        }
        Ok(self.chars[start..self.at].iter().collect())
    }

    /// A value: quoted, or everything up to whitespace or `,`.
    fn value(&mut self) -> Result<String, String> {
        if self.peek() == Some('"') {
            return self.quoted();
        }
        let start = self.at;
        while self.peek().is_some_and(|c| !c.is_whitespace() && c != ',') {
            self.at += 1;
        }
        if start == self.at {
            return Err(format!("expected a value at {start}"));
        }
        Ok(self.chars[start..self.at].iter().collect())
    }

    fn quoted(&mut self) -> Result<String, String> {
        let start = self.at;
        self.at += 1;
        let mut out = String::new();
        loop {
            match self.next() {
                None => return Err(format!("unterminated quote at {start}")),
                Some('"') => return Ok(out),
                Some('\\') => match self.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(c) => out.push(c),
                    None => return Err(format!("unterminated quote at {start}")),
                },
                Some(c) => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    struct Item {
        name: &'static str,
        parent: &'static str,
        labels: BTreeMap<String, String>,
    }

    impl Fields for Item {
        fn field(&self, path: &[String]) -> Option<String> {
            match path {
                [f] if f == "name" => Some(self.name.into()),
                [f] if f == "parent" => Some(self.parent.into()),
                [f, key] if f == "labels" => self.labels.get(key).cloned(),
                _ => None,
            }
        }
    }

    fn item() -> Item {
        Item {
            name: "default/3/sha256:aa",
            parent: "default/2/sha256:bb",
            labels: [("containerd.io/snapshot.ref".to_string(), "sha256:aa".into())].into(),
        }
    }

    fn matches(filters: &[&str]) -> bool {
        let filters: Vec<String> = filters.iter().map(|s| s.to_string()).collect();
        Filters::parse(&filters).unwrap().matches(&item())
    }

    #[test]
    fn the_filter_containerd_sends_after_already_exists_matches() {
        assert!(matches(&[
            r#"labels."containerd.io/snapshot.ref"==sha256:aa,parent=="default/2/sha256:bb""#
        ]));
        assert!(!matches(&[
            r#"labels."containerd.io/snapshot.ref"==sha256:aa,parent=="other""#
        ]));
    }

    #[test]
    fn selectors_and_filters_combine_as_and_within_or_across() {
        assert!(matches(&[]));
        assert!(matches(&["name==nope", "name==default/3/sha256:aa"]));
        assert!(!matches(&["name==default/3/sha256:aa,parent==nope"]));
        assert!(matches(&["name!=nope"]));
        assert!(matches(&[r#"labels."containerd.io/snapshot.ref""#]));
        assert!(!matches(&["labels.missing"]));
        assert!(matches(&["name~=sha256"]));
    }

    #[test]
    fn malformed_filters_are_refused_with_the_reason() {
        for bad in [
            "name==",
            r#"labels."unterminated"#,
            "name==a,",
            "==x",
            "name~=a.*",
        ] {
            let err = Filters::parse(&[bad.to_string()]).unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
    }
}
