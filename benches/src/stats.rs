//! Latency samples and the figures the tables report: median, p99 and max by nearest
//! rank over every individual operation (criterion's per-iteration means cannot give a
//! p99 of single deletes inside a storm, which is what stall S1 is about).

use std::time::Duration;

use serde::Serialize;

/// Every measured operation of one case, in the order measured.
#[derive(Debug, Clone, Default)]
pub struct Samples(Vec<Duration>);

impl Samples {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    pub fn summary(&self) -> Summary {
        let mut sorted = self.0.clone();
        sorted.sort();
        let rank = |q: f64| -> Duration {
            if sorted.is_empty() {
                return Duration::ZERO;
            }
            let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            sorted[index]
        };
        Summary {
            n: sorted.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: sorted.last().copied().unwrap_or_default(),
        }
    }
}

impl FromIterator<Duration> for Samples {
    fn from_iter<I: IntoIterator<Item = Duration>>(iter: I) -> Self {
        Samples(iter.into_iter().collect())
    }
}

/// Nearest-rank percentiles of a [`Samples`].
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub n: usize,
    #[serde(with = "seconds")]
    pub p50: Duration,
    #[serde(with = "seconds")]
    pub p99: Duration,
    #[serde(with = "seconds")]
    pub max: Duration,
}

impl Summary {
    /// This median over `baseline`'s, as the tables print it ("0.12×").
    pub fn ratio_to(&self, baseline: &Summary) -> String {
        ratio(self.p50, baseline.p50)
    }
}

/// The rounds of a storm: every operation's latency and each round's wall time.
#[derive(Debug, Clone, Default)]
pub struct Rounds {
    ops: Samples,
    walls: Samples,
}

impl Rounds {
    /// Adds one round's operations and its wall time.
    pub fn add(&mut self, (ops, wall): (Samples, Duration)) {
        self.ops.extend(ops);
        self.walls.push(wall);
    }

    pub fn result(&self) -> StormResult {
        StormResult {
            ops: self.ops.summary(),
            wall: self.walls.summary().p50,
        }
    }
}

/// What a storm's table row reports: per-operation percentiles and the median round.
#[derive(Debug, Clone, Copy)]
pub struct StormResult {
    pub ops: Summary,
    pub wall: Duration,
}

impl StormResult {
    /// Operation p50, p99, p50 vs `base`, median wall time, wall time vs `base`.
    pub fn cells(&self, base: &StormResult) -> Vec<String> {
        vec![
            human(self.ops.p50),
            human(self.ops.p99),
            self.ops.ratio_to(&base.ops),
            human(self.wall),
            ratio(self.wall, base.wall),
        ]
    }
}

/// `value / baseline` as a table cell.
pub fn ratio(value: Duration, baseline: Duration) -> String {
    if baseline.is_zero() {
        return "–".into();
    }
    let r = value.as_secs_f64() / baseline.as_secs_f64();
    if r >= 10.0 {
        format!("{r:.0}×")
    } else if r >= 0.1 {
        format!("{r:.2}×")
    } else if r >= 0.01 {
        format!("{r:.3}×")
    } else {
        // "1/18000": a caller waiting microseconds instead of half a second.
        let inverse = 1.0 / r;
        let magnitude = 10f64.powi(inverse.log10().floor() as i32 - 1).max(1.0);
        format!("1/{:.0}", (inverse / magnitude).round() * magnitude)
    }
}

/// A duration as a table cell, in the unit that keeps three significant digits.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 0.01 {
        format!("{:.0} ms", s * 1e3)
    } else if s >= 0.001 {
        format!("{:.2} ms", s * 1e3)
    } else if s >= 1e-5 {
        format!("{:.0} µs", s * 1e6)
    } else {
        format!("{:.2} µs", s * 1e6)
    }
}

mod seconds {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Samples = (1..=100).map(Duration::from_millis).collect();
        let s = samples.summary();
        assert_eq!(s.n, 100);
        assert_eq!(s.p50, Duration::from_millis(50));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.max, Duration::from_millis(100));
    }

    #[test]
    fn small_sets_report_their_worst_as_p99() {
        let samples: Samples = [3, 1, 2].into_iter().map(Duration::from_secs).collect();
        let s = samples.summary();
        assert_eq!(s.p50, Duration::from_secs(2));
        assert_eq!(s.p99, Duration::from_secs(3));
    }

    #[test]
    fn cells_are_readable() {
        assert_eq!(human(Duration::from_micros(2500)), "2.50 ms");
        assert_eq!(human(Duration::from_millis(460)), "460 ms");
        assert_eq!(human(Duration::from_secs(3)), "3.00 s");
        assert_eq!(
            ratio(Duration::from_millis(8), Duration::from_millis(460)),
            "0.017×"
        );
        assert_eq!(
            ratio(Duration::from_micros(28), Duration::from_millis(510)),
            "1/18000"
        );
    }
}
