//! Orders for interleaving variants round by round so that each one follows every other
//! equally often (a Williams design): what a call leaves behind (an unmount's sync also
//! commits the previous cycle's unsynced work) then falls on every variant alike.

/// Round orders of `n` variants: take round `i`'s from `orders[i % orders.len()]`. Over
/// the whole list every ordered pair of distinct variants is adjacent equally often: once
/// per list for even `n`, twice for odd `n` (whose list is twice as long).
pub fn balanced_orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return Vec::new();
    }
    // 0, n-1, 1, n-2, 2, …: the steps between neighbours are all different mod n.
    let mut first = Vec::with_capacity(n);
    let (mut low, mut high) = (0, n);
    while first.len() < n {
        first.push(low);
        low += 1;
        if first.len() < n {
            high -= 1;
            first.push(high);
        }
    }
    let mut orders: Vec<Vec<usize>> = (0..n)
        .map(|shift| first.iter().map(|v| (v + shift) % n).collect())
        .collect();
    if n % 2 == 1 {
        let reversed: Vec<Vec<usize>> = orders
            .iter()
            .map(|o| o.iter().rev().copied().collect())
            .collect();
        orders.extend(reversed);
    }
    orders
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn every_variant_follows_every_other_equally_often() {
        for n in 1..=7 {
            let orders = balanced_orders(n);
            let mut follows: HashMap<(usize, usize), usize> = HashMap::new();
            for order in &orders {
                let mut sorted = order.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "{n}: {order:?}");
                for pair in order.windows(2) {
                    *follows.entry((pair[0], pair[1])).or_default() += 1;
                }
            }
            let counts: Vec<usize> = follows.values().copied().collect();
            assert_eq!(follows.len(), n * (n - 1), "{n}: {orders:?}");
            assert!(counts.iter().all(|c| *c == counts[0]), "{n}: {follows:?}");
        }
    }
}
