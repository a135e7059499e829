//! An order for interleaving variants in which each one directly follows every other
//! equally often, across the whole run: what a call leaves behind (an unmount's sync also
//! commits the previous cycle's unsynced work) then falls on every variant alike.

/// A sequence of `n` variants to repeat end to end: repeated, every ordered pair of
/// distinct variants is adjacent exactly once per repetition, the pair that wraps from its
/// end to its start included. It is an Eulerian circuit of the complete directed graph on
/// `n` vertices, so each variant appears `n - 1` times in it (once for `n == 1`).
pub fn balanced_sequence(n: usize) -> Vec<usize> {
    if n <= 1 {
        return vec![0; n];
    }
    // Hierholzer's algorithm: walk unused edges, backing out of dead ends into the circuit.
    let mut unused: Vec<Vec<usize>> = (0..n)
        .map(|v| (0..n).filter(|&w| w != v).collect())
        .collect();
    let mut walk = vec![0];
    let mut circuit = Vec::with_capacity(n * (n - 1) + 1);
    while let Some(&v) = walk.last() {
        match unused[v].pop() {
            Some(w) => walk.push(w),
            None => circuit.extend(walk.pop()),
        }
    }
    circuit.reverse();
    // It ends where it started: the repetition's wrap is that last edge.
    circuit.pop();
    circuit
}

/// How many times each variant runs when [`balanced_sequence`] is repeated until each has
/// run at least `wanted` times: whole repetitions only, so the balance holds.
pub fn balanced_count(n: usize, wanted: usize) -> usize {
    let per_repetition = n.saturating_sub(1).max(1);
    wanted.div_ceil(per_repetition) * per_repetition
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn every_variant_follows_every_other_once_per_repetition() {
        for n in 1..=12 {
            let sequence = balanced_sequence(n);
            assert_eq!(sequence.len(), n * n.saturating_sub(1).max(1), "{n}");
            // Two repetitions end to end, and the wrap back to the start.
            let stream: Vec<usize> = sequence.iter().chain(&sequence).copied().collect();
            let mut follows: HashMap<(usize, usize), usize> = HashMap::new();
            for pair in stream
                .windows(2)
                .chain(std::iter::once(&[stream[stream.len() - 1], stream[0]][..]))
            {
                *follows.entry((pair[0], pair[1])).or_default() += 1;
            }
            if n == 1 {
                assert_eq!(sequence, vec![0]);
                continue;
            }
            assert_eq!(follows.len(), n * (n - 1), "{n}: {sequence:?}");
            assert!(follows.values().all(|c| *c == 2), "{n}: {follows:?}");
            for v in 0..n {
                let times = sequence.iter().filter(|w| **w == v).count();
                assert_eq!(times, n - 1, "{n}: {v} in {sequence:?}");
            }
        }
    }

    #[test]
    fn counts_are_whole_repetitions_of_at_least_what_was_wanted() {
        assert_eq!(balanced_count(4, 200), 201);
        assert_eq!(balanced_count(4, 3), 3);
        assert_eq!(balanced_count(8, 2000), 2002);
        assert_eq!(balanced_count(1, 5), 5);
        assert_eq!(balanced_count(2, 5), 5);
    }
}
