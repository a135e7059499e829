//! Registry text as lamina shows it. Whatever came from a registry, or from ureq talking
//! about one (its error texts quote `Location` headers and URIs whole), may hold a signed
//! storage URL whose query string is a credential (`?X-Amz-Signature=…`), may be any
//! length (a manifest's `urls` entry of 100 KB), and may hold control characters. So every
//! such text passes through here before it reaches an error or a log line: each query
//! becomes `?…`, and [`lamina_image::shown`] escapes control characters and cuts the
//! result at its bound (512 bytes, with a marker).

/// A URL to show: everything after its first `?` hidden.
pub(crate) fn url(u: &str) -> String {
    match u.split_once('?') {
        Some((before, _)) => lamina_image::shown(&format!("{before}?…")),
        None => lamina_image::shown(u),
    }
}

/// Free text from ureq or a registry: in each whitespace-separated word, whatever follows
/// a `?` is hidden (a `?` that ends a word is punctuation, and stays).
pub(crate) fn text(t: &str) -> String {
    let mut out = String::with_capacity(t.len().min(1024));
    let mut hiding = false;
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            hiding = false;
        } else if hiding {
            continue;
        } else if c == '?' && chars.peek().is_some_and(|next| !next.is_whitespace()) {
            out.push_str("?…");
            hiding = true;
            continue;
        }
        out.push(c);
    }
    lamina_image::shown(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_hidden_in_urls_and_in_free_text() {
        assert_eq!(
            url("https://s3.example/blob?X-Amz-Signature=SECRET&a=b"),
            "https://s3.example/blob?…"
        );
        assert_eq!(url("http://r.example/v2/"), "http://r.example/v2/");
        assert_eq!(
            text("protocol: location header is malformed: /a b?X-Amz-Signature=SECRET next"),
            "protocol: location header is malformed: /a b?… next"
        );
        assert_eq!(text("a question? no"), "a question? no");
    }

    #[test]
    fn registry_text_stays_on_one_bounded_line() {
        let long = format!("http://r.example/{}?sig=SECRET", "a".repeat(100_000));
        for shown in [
            url(&long),
            text(&format!("bad uri: {long} is missing host")),
        ] {
            assert!(shown.len() < 600, "{} bytes", shown.len());
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        assert_eq!(text("a\nforged: line"), "a\\nforged: line");
    }
}
