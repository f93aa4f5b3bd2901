//! The VM test runner.
