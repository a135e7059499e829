//! Pre-mounted read-write overlays claimed from the image's pool (stall S2).

pub mod fill;
pub mod pool;
