//! The part of the `openssl` crate's API composefs calls — `hash::{Hasher, MessageDigest}`
//! for SHA-256, SHA-384 and SHA-512 — on RustCrypto's `sha2`. Anything else composefs
//! might call one day fails to build, never to run.
//!
//! Why: OpenSSL's libcrypto runs a CPU probe (`OPENSSL_ia32_cpuid`, several `cpuid`
//! instructions, each a trap to the hypervisor on a VM) from its `.init` section in every
//! process that links it, whether it hashes or not, and lamina is a process per Garden
//! call. sha2 probes lazily, on the first hash, and uses the same SHA extensions.

pub mod error;
pub mod hash;
