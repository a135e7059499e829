//! lamina benchmarks: see `benches/` and docs/benchmarks.md.
