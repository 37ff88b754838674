//! The page answered instead of Ray's dashboard when the URL names a cluster or session that is
//! not stored. Ray's proxy shows its own (empty) cluster after any 404, and Ray's pages show
//! none of the messages of the JSON routes they fetch, so this page is the one place a mistyped
//! URL can be told apart from an empty history.

/// The page, saying `message` (why nothing is stored there, naming what is).
pub(super) fn missing_page(message: &str) -> Vec<u8> {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Afterglow: not in this history</title>\
         <style>body{{font-family:system-ui,sans-serif;max-width:44rem;margin:4rem auto;\
         padding:0 1rem;line-height:1.5}}code{{background:#f3f3f3;padding:0 .2em}}</style>\
         </head><body>\n<h1>Not in this history</h1>\n<p>{}</p>\n\
         <p>Ray's dashboard shows a history when started with \
         <code>--proxy-server-url</code> set to Afterglow's \
         <code>/ray/{{cluster}}/{{session|latest}}</code> of a stored cluster; \
         Afterglow's own page lists every cluster and session.</p>\n</body></html>\n",
        escaped(message)
    )
    .into_bytes()
}

/// `text` with the characters HTML gives a meaning escaped.
pub(super) fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_shown_as_text_never_as_markup() {
        let page = String::from_utf8(missing_page("no cluster `<script>x</script>` & more"))
            .unwrap_or_default();
        assert!(page.contains("no cluster `&lt;script&gt;x&lt;/script&gt;` &amp; more"));
        assert!(!page.contains("<script>"));
    }
}
