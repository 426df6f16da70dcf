//! The downlink pipeline (filled in below).
pub mod scheduler;
