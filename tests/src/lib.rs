//! The integration-test crate. Its tests live in `tests/tests/*.rs` and use
//! only the public API of `snapflow`, exactly as a user's crate would. This
//! library holds the helpers those tests share and nothing else.
