//! Shared helpers for the runnable examples in this folder. The examples
//! themselves live beside this crate as `[[example]]` targets; this library
//! only exists so that the package has a target of its own.
