//! Compile-time tests of `#[derive(Snapshot)]` with trybuild: each
//! `ui/fail_*.rs` holds one mistake and its `.stderr` the exact error, with
//! the span on the user's token; `ui/pass_*.rs` hold shapes that must
//! compile without warnings in unusual surroundings.
//!
//! Regenerate the expected output with `TRYBUILD=overwrite` and then read
//! every changed `.stderr` before committing it. The expected text depends
//! on the compiler version for the few cases where rustc itself reports the
//! error (missing trait impls), which is a known source of churn.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass_*.rs");
    cases.compile_fail("tests/ui/fail_*.rs");
}
