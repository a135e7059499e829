//! SIGKILL at random moments: 100 runs, each killing one lamina process (an import, a
//! create, a delete, a clean or a pool fill) after a random delay below the median of that
//! operation's uninterrupted durations (measured first, then every run that beat its kill). After each kill, `lamina clean` (recovery only: the threshold is
//! never reached) must finish or undo what the dead process left, `check` must find the
//! store consistent, a container the killed process reported must be whole (and one it
//! reported deleted must be gone), and a fresh create must give the complete image.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use lamina_integration::rng::Xorshift;
use lamina_integration::scratch::mounts_under;
use lamina_integration::{FsKind, Lamina, ScratchFs, require_root, sample_image};

const RUNS: usize = 100;
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

    fn ok(&self, args: &[&str]) {
        let out = self.lamina.run(args);
        assert_eq!(out.code, 0, "{args:?}: {out:?}");
    }

    /// Brings the store to what `op` needs, and returns its arguments.
    fn prepare(&self, op: Op, run: usize) -> Vec<String> {
        let id = format!("r{run}");
        match op {
            Op::Import => {
                self.remove_all();
                self.ok(&["clean", "--threshold-bytes", "0"]);
                vec!["create".into(), self.image.clone(), id]
            }
            Op::Create => vec!["create".into(), self.image.clone(), id],
            Op::Delete => {
                self.ok(&["create", &self.image, &id]);
                vec!["delete".into(), id]
            }
            Op::Clean => {
                self.ok(&["create", &self.image, &id]);
                self.ok(&["delete", &id]);
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

    /// How long `op` takes uninterrupted here, three times over (the first of a kind also
    /// probes and warms caches): the first samples of the range kill delays are drawn from.
    fn measure(&self, op: Op) -> Vec<Duration> {
        (0..3)
            .map(|i| {
                let args = self.prepare(op, 9990 + i);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let started = Instant::now();
                self.ok(&args);
                let took = started.elapsed();
                self.recover_and_reset();
                took
            })
            .collect()
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
    fn assert_recovered(&self, op: Op, run: usize, printed: &str) {
        let context = format!("run {run} ({op:?}), killed process printed {printed:?}");
        let out = self.lamina.run(&RECOVER);
        assert_eq!(out.code, 0, "{context}: recovery failed: {out:?}");
        let check = self.lamina.run(&["check"]);
        assert_eq!(check.code, 0, "{context}: check after recovery: {check:?}");

        let id = format!("r{run}");
        let exists = lamina_integration::records::record_exists(
            &self
                .lamina
                .store
                .join("images")
                .join(&id)
                .join("container.json"),
        );
        match op {
            Op::Import | Op::Create if printed.contains("\"root\"") => {
                assert!(exists, "{context}: a reported container was lost");
                self.assert_whole(&id, &context);
            }
            Op::Import | Op::Create if exists => self.assert_whole(&id, &context),
            Op::Delete if printed.contains("deleted container") => {
                assert!(!exists, "{context}: a reported delete came back");
            }
            Op::Delete if exists => self.assert_whole(&id, &context),
            _ => {}
        }

        // The next create gets the whole image, from whatever layers survived.
        let probe = format!("after-{run}");
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
    let mut durations: Vec<Vec<Duration>> = OPS.iter().map(|op| crash.measure(*op)).collect();
    eprintln!("uninterrupted durations: {durations:?}");

    // Seeded: the same delays on every run, so a failure reproduces.
    let mut rng = Xorshift::new(0x5eed_1a41_17a0_0001);
    let mut killed = [0usize; 5];
    for run in 0..RUNS {
        let op = OPS[run % OPS.len()];
        let args = crash.prepare(op, run);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let seen = &mut durations[run % OPS.len()];
        let delay = Duration::from_micros(rng.below(median(seen).as_micros() as u64));
        let child = crash.spawn(&args);
        let (out, finished_in) = kill_after(child, delay);
        match finished_in {
            Some(took) => seen.push(took),
            None => killed[run % OPS.len()] += 1,
        }
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        crash.assert_recovered(op, run, &printed);
        if op == Op::PoolFill || run % 10 == 9 {
            crash.recover_and_reset();
        }
    }
    // The delays must land inside the operations, or this test proves nothing.
    let medians: Vec<Duration> = durations.iter().map(|seen| median(seen)).collect();
    eprintln!(
        "killed mid-operation, per {OPS:?}: {killed:?} of {} each; final medians {medians:?}",
        RUNS / OPS.len()
    );
    for (op, n) in OPS.iter().zip(killed) {
        assert!(
            n >= RUNS / OPS.len() / 3,
            "{op:?}: only {n} runs were killed mid-way"
        );
    }
    crash.recover_and_reset();
    lamina.run(&["clean", "--threshold-bytes", "0"]).ok();
    assert!(mounts_under(&lamina.store).is_empty());
    assert_eq!(lamina.entries("layers"), 0);
}

/// The middle of what a kind of operation took uninterrupted, in the measuring runs and in
/// every run that finished before its kill. Drawing delays below it lands at least half of
/// them inside the operation however the load of the machine or the state the runs leave
/// moves its duration away from the first measurement.
fn median(seen: &[Duration]) -> Duration {
    let mut sorted = seen.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// SIGKILLs `child` once `delay` has passed, unless it exits first. Returns its output and,
/// when it finished on its own, how long it ran (to within the poll interval).
fn kill_after(mut child: Child, delay: Duration) -> (std::process::Output, Option<Duration>) {
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
    let was_killed = out.status.signal() == Some(9);
    (
        out,
        if was_killed {
            None
        } else {
            finished_in.or(Some(delay))
        },
    )
}
