//! SIGKILL at random moments: 100 runs of an import, a create, a delete, a clean or a pool
//! fill, 20 of each. Every fourth run of each, the first included, runs uninterrupted and
//! is timed; the others are killed after a random delay below the lower median of those
//! times. A killed run whose operation ended before the kill is tried again, up to five
//! times, with a delay below what that try took.
//! After each try, `lamina clean` (recovery only: the threshold is never reached) must
//! finish or undo what a dead process left, `check` must find the store consistent, a
//! container the process reported must be whole (and one it reported deleted must be
//! gone), and a fresh create must give the complete image.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use lamina_integration::rng::Xorshift;
use lamina_integration::scratch::mounts_under;
use lamina_integration::{FsKind, Lamina, ScratchFs, require_root, sample_image};

const RUNS: usize = 100;
/// Tries a killed run gets before it counts as one whose kill missed the operation.
const TRIES_PER_KILL: usize = 5;
/// A threshold no test store reaches: `clean` then only finishes crashed work.
const RECOVER: [&str; 3] = ["clean", "--threshold-bytes", "1000000000000000"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Import,
    Create,
    Delete,
    Clean,
    PoolFill,
}

const OPS: [Op; 5] = [Op::Import, Op::Create, Op::Delete, Op::Clean, Op::PoolFill];

struct Crash<'a> {
    lamina: &'a Lamina,
    image: String,
    busybox_len: u64,
}

impl Crash<'_> {
    fn spawn(&self, args: &[&str]) -> Child {
        self.lamina
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Brings the store to what `op` needs, starts it and kills it after `delay` unless it
    /// exits first.
    fn try_once(&self, op: Op, id: &str, delay: Duration) -> (Output, Option<Duration>) {
        let args = self.prepare(op, id);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kill_after(self.spawn(&args), delay)
    }

    fn ok(&self, args: &[&str]) {
        let out = self.lamina.run(args);
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
    }

    /// Brings the store to what `op` needs, and returns its arguments.
    fn prepare(&self, op: Op, id: &str) -> Vec<String> {
        match op {
            Op::Import => {
                self.remove_all();
                self.ok(&["clean", "--threshold-bytes", "0"]);
                vec!["create".into(), self.image.clone(), id.into()]
            }
            Op::Create => vec!["create".into(), self.image.clone(), id.into()],
            Op::Delete => {
                self.ok(&["create", &self.image, id]);
                vec!["delete".into(), id.into()]
            }
            Op::Clean => {
                self.ok(&["create", &self.image, id]);
                self.ok(&["delete", id]);
                vec!["clean".into(), "--threshold-bytes".into(), "0".into()]
            }
            Op::PoolFill => {
                // Creates' background refills keep the pool full; start from empty.
                self.ok(&["pool", "drain"]);
                vec![
                    "pool".into(),
                    "fill".into(),
                    "--size".into(),
                    "2".into(),
                    self.image.clone(),
                ]
            }
        }
    }

    fn remove_all(&self) {
        for entry in std::fs::read_dir(self.lamina.store.join("images")).unwrap() {
            let id = entry.unwrap().file_name().to_string_lossy().into_owned();
            self.ok(&["delete", &id]);
        }
    }

    fn recover_and_reset(&self) {
        self.ok(&RECOVER);
        self.ok(&["pool", "drain"]);
        self.remove_all();
        self.ok(&RECOVER);
    }

    /// What every run must find after the kill and one recovering command.
    fn assert_recovered(&self, op: Op, id: &str, printed: &str, kill: &str) {
        let context = format!("{id} ({op:?}), {kill}, the process printed {printed:?}");
        let out = self.lamina.run(&RECOVER);
        assert_eq!(out.code, 0, "{context}: recovery failed: {out:?}");
        let check = self.lamina.run(&["check"]);
        assert_eq!(check.code, 0, "{context}: check after recovery: {check:?}");

        let exists = lamina_integration::records::record_exists(
            &self
                .lamina
                .store
                .join("images")
                .join(id)
                .join("container.json"),
        );
        match op {
            Op::Import | Op::Create if printed.contains("\"root\"") => {
                assert!(exists, "{context}: a reported container was lost");
                self.assert_whole(id, &context);
            }
            Op::Import | Op::Create if exists => self.assert_whole(id, &context),
            Op::Delete if printed.contains("deleted container") => {
                assert!(!exists, "{context}: a reported delete came back");
            }
            Op::Delete if exists => self.assert_whole(id, &context),
            _ => {}
        }

        // The next create gets the whole image, from whatever layers survived.
        let probe = format!("after-{id}");
        let out = self.lamina.run(&["create", &self.image, &probe]);
        assert_eq!(out.code, 0, "{context}: create after recovery: {out:?}");
        self.assert_whole(&probe, &context);
        self.ok(&["delete", &probe]);
    }

    fn assert_whole(&self, id: &str, context: &str) {
        let busybox = self.lamina.rootfs(id).join("bin/busybox");
        let len = std::fs::metadata(&busybox).map(|m| m.len()).unwrap_or(0);
        assert_eq!(len, self.busybox_len, "{context}: {id} is not whole");
    }
}

#[test]
fn sigkill_at_random_points_loses_nothing_and_leaks_nothing() {
    require_root();
    let fs = ScratchFs::loop_backed(FsKind::Ext4, 1024, false);
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    let busybox_len = std::fs::metadata(lamina_sample::DEFAULT_BUSYBOX)
        .unwrap()
        .len();
    let crash = Crash {
        lamina: &lamina,
        image,
        busybox_len,
    };
    // Seeded draws; the delays they make scale with the durations measured in this run.
    let mut rng = Xorshift::new(0x5eed_1a41_17a0_0001);
    let mut measured: Vec<Vec<Duration>> = vec![Vec::new(); OPS.len()];
    let mut killed = [0usize; 5];
    let mut kill_runs = [0usize; 5];
    let mut tries = [0usize; 5];
    for run in 0..RUNS {
        let which = run % OPS.len();
        let op = OPS[which];
        // The first run of each operation and every fourth after it run uninterrupted,
        // started and timed as the killed ones are, in the state the loop leaves: their
        // durations, not a guess made outside the loop, set the range of later delays.
        if (run / OPS.len()).is_multiple_of(4) {
            let id = format!("r{run}");
            let (out, finished_in) = crash.try_once(op, &id, Duration::MAX);
            let printed = String::from_utf8_lossy(&out.stdout).into_owned();
            // Each operation prints one line when it is done: what tells a kill after
            // the work from one inside it.
            assert!(
                out.status.success() && !printed.trim().is_empty(),
                "{id} ({op:?}) uninterrupted: {out:?}"
            );
            measured[which].push(finished_in.unwrap());
            crash.assert_recovered(op, &id, &printed, "uninterrupted");
        } else {
            kill_runs[which] += 1;
            // A try whose operation ended before its delay is tried again in a fresh
            // state, with a delay drawn below what that try took: a run misses only when
            // every try finished early, however fast the operation has become.
            let mut bound = median(&measured[which]);
            for attempt in 0..TRIES_PER_KILL {
                tries[which] += 1;
                let id = format!("r{run}-{attempt}");
                let delay = Duration::from_micros(rng.below((bound.as_micros() as u64).max(1)));
                let (out, finished_in) = crash.try_once(op, &id, delay);
                let printed = String::from_utf8_lossy(&out.stdout).into_owned();
                let context = format!("killed after {delay:?} (drawn below {bound:?})");
                crash.assert_recovered(op, &id, &printed, &context);
                if finished_in.is_none() && printed.trim().is_empty() {
                    killed[which] += 1;
                    break;
                }
                bound = bound.min(finished_in.unwrap_or(delay));
            }
        }
        if op == Op::PoolFill || run % 10 == 9 {
            crash.recover_and_reset();
        }
    }
    // The delays must land inside the operations, or this test proves nothing.
    let medians: Vec<Duration> = measured.iter().map(|m| median(m)).collect();
    eprintln!(
        "killed mid-operation, per {OPS:?}: {killed:?} of {kill_runs:?} runs in {tries:?} tries; \
         medians {medians:?}"
    );
    for ((op, n), runs) in OPS.iter().zip(killed).zip(kill_runs) {
        assert!(
            n >= runs * 2 / 3,
            "{op:?}: only {n} of {runs} runs were killed mid-way"
        );
    }
    crash.recover_and_reset();
    lamina.run(&["clean", "--threshold-bytes", "0"]).ok();
    assert!(mounts_under(&lamina.store).is_empty());
    assert_eq!(lamina.entries("layers"), 0);
}

/// The lower middle of what an operation took in its uninterrupted runs. A delay drawn
/// below it lands inside the operation more often than not, however the machine's load or
/// the loop's state moves its duration.
fn median(seen: &[Duration]) -> Duration {
    let mut sorted = seen.to_vec();
    sorted.sort();
    sorted[(sorted.len() - 1) / 2]
}

/// SIGKILLs `child` once `delay` has passed, unless it exits first. Returns its output and,
/// when it finished on its own, how long it ran (to within the poll interval).
fn kill_after(mut child: Child, delay: Duration) -> (Output, Option<Duration>) {
    const POLL: Duration = Duration::from_micros(100);
    let started = Instant::now();
    let finished_in = loop {
        if child.try_wait().unwrap().is_some() {
            break Some(started.elapsed());
        }
        let elapsed = started.elapsed();
        if elapsed >= delay {
            let _ = child.kill(); // it may have exited since the poll
            break None;
        }
        std::thread::sleep(POLL.min(delay - elapsed));
    };
    let out = child.wait_with_output().unwrap();
    // Exited between the poll and the kill: it finished about when the kill was sent.
    let finished_in = match out.status.signal() {
        Some(9) => None,
        _ => finished_in.or(Some(started.elapsed())),
    };
    (out, finished_in)
}
