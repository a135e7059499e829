//! How an import shows its progress: a bar per layer when a person is watching (stderr is
//! a terminal), structured log lines when a supervisor is (Garden, systemd, a pipe).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use lamina_image::LayerBlob;
use lamina_store::ImportProgress;

/// A log line per layer at most this often while it downloads.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// How a layer is named on a bar: its position and the start of its digest.
fn label(layer: &LayerBlob) -> String {
    let id = layer.digest.as_ref().unwrap_or(&layer.diff_id).to_string();
    let short: String = id.chars().take("sha256:".len() + 12).collect();
    format!("layer {} {short}", layer.index)
}

/// One bar per layer on stderr. Log lines printed meanwhile go above the bars (see
/// `logging`), so neither garbles the other.
#[derive(Debug)]
pub struct Bars {
    multi: MultiProgress,
    bars: Mutex<HashMap<usize, ProgressBar>>,
}

impl Bars {
    /// Bars on stderr if it is a terminal.
    pub fn on_terminal() -> Option<Bars> {
        std::io::stderr().is_terminal().then(|| Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Mutex::new(HashMap::new()),
        })
    }

    pub fn multi(&self) -> MultiProgress {
        self.multi.clone()
    }

    fn with_bar(&self, layer: &LayerBlob, f: impl FnOnce(&ProgressBar)) {
        if let Ok(bars) = self.bars.lock()
            && let Some(bar) = bars.get(&layer.index)
        {
            f(bar);
        }
    }
}

impl ImportProgress for Bars {
    fn present(&self, layer: &LayerBlob) {
        let _ = self
            .multi
            .println(format!("{}  already in the store", label(layer)));
    }

    fn started(&self, layer: &LayerBlob) {
        let bar = match layer.size {
            Some(size) => ProgressBar::new(size).with_style(
                ProgressStyle::with_template(
                    "{prefix}  [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            ),
            // A layer of unknown size (a docker save archive) can only count.
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{prefix}  {spinner} {bytes} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        let bar = self.multi.add(bar.with_prefix(label(layer)));
        if let Ok(mut bars) = self.bars.lock() {
            bars.insert(layer.index, bar);
        }
    }

    fn advanced(&self, layer: &LayerBlob, bytes: u64) {
        self.with_bar(layer, |bar| bar.inc(bytes));
    }

    fn finished(&self, layer: &LayerBlob, ok: bool) {
        self.with_bar(layer, |bar| {
            if ok {
                bar.finish_with_message("done");
            } else {
                bar.abandon_with_message("failed");
            }
        });
    }
}

/// `fetching layer` when a layer starts, `layer progress` at most every [`LOG_EVERY`]
/// while it downloads (the store logs `imported layer` when it is in).
#[derive(Debug, Default)]
pub struct LogLines {
    /// Per layer index: bytes read so far, and when the last line was logged.
    read: Mutex<HashMap<usize, (u64, Instant)>>,
}

impl ImportProgress for LogLines {
    fn present(&self, layer: &LayerBlob) {
        tracing::info!(layer = %layer.describe(), "layer already in the store");
    }

    fn started(&self, layer: &LayerBlob) {
        if let Ok(mut read) = self.read.lock() {
            read.insert(layer.index, (0, Instant::now()));
        }
        tracing::info!(layer = %layer.describe(), bytes = layer.size, "fetching layer");
    }

    fn advanced(&self, layer: &LayerBlob, bytes: u64) {
        let Ok(mut read) = self.read.lock() else {
            return;
        };
        let Some((total, last)) = read.get_mut(&layer.index) else {
            return;
        };
        *total += bytes;
        if last.elapsed() >= LOG_EVERY {
            *last = Instant::now();
            tracing::info!(
                layer = %layer.describe(), read = *total, of = layer.size, "layer progress"
            );
        }
    }

    fn finished(&self, layer: &LayerBlob, _ok: bool) {
        if let Ok(mut read) = self.read.lock() {
            read.remove(&layer.index);
        }
    }
}
