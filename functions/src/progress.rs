//! Progress bars for long commands (`compact`, `rebuild`, `bench`, `generate`).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps labelled `what`, on stderr; indicatif hides it when stderr is not a
/// terminal, so logs and tests see only the final report.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}
