//! `#[derive(Snapshot)]` for snapflow, re-exported as `snapflow::Snapshot`.
//!
//! This crate owns the compile-time half of the state layer: it reads a type
//! and its `#[snapshot(...)]` attributes and writes an implementation of
//! `snapflow::state::Snapshot`. It never defines the byte format itself; the
//! generated code only calls helpers in `snapflow::__private`, so the format
//! lives in one place at runtime.
//!
//! The macro works in three steps, one module each: `parse` reads the
//! attributes into raw key/value entries, `validate` checks them and builds
//! a `model::Model`, and `expand` turns the model into tokens. Every
//! mistake is reported with the span of the user's token, and all mistakes
//! of one derive are reported together.
//!
//! # What is generated
//!
//! - `const SCHEMA`: the type name (the ident, without generics), the
//!   version, and every stored field with its type as written in the source.
//!   Skipped fields are not part of the schema.
//! - `encode_payload` / `decode_payload`: the stored fields, each encoded
//!   with postcard through serde, one after another in declaration order; an
//!   enum first writes its variant index (declaration order, from 0). The
//!   type itself does not need to implement serde's traits, only its stored
//!   field types do. Decoding must consume the whole payload.
//! - `decode_stored`, only when `upgrade_from` is given: the upgrade chain.
//!
//! Generic types get where-clause bounds per field type: a serde-encoded
//! field whose type mentions a type or const parameter needs
//! `FieldType: Serialize + DeserializeOwned`, a `nested` one needs
//! `FieldType: Snapshot`.
//!
//! # Attributes
//!
//! On the type:
//!
//! | attribute | meaning |
//! |---|---|
//! | `#[snapshot(version = N)]` | the schema version, an integer `N >= 1`; default 1 |
//! | `#[snapshot(version = N, upgrade_from = Old)]` | values stored with an older version are decoded as `Old` and converted with `From<Old>`; needs `N >= 2`, `Old: Snapshot` with a lower version, and `Self: From<Old>` |
//! | `#[snapshot(name = "Counter")]` | the type name recorded in the schema, instead of the ident; lets a renamed old type (`CounterV1`) still read what `Counter` wrote |
//! | `#[snapshot(crate = "path")]` | the path of the snapflow crate in generated code, instead of `::snapflow`; e.g. `"sf"` after `extern crate snapflow as sf;`, or `"crate"` inside snapflow itself |
//!
//! On a field:
//!
//! | attribute | meaning |
//! |---|---|
//! | `#[snapshot(skip)]` | not stored; restored as `Default::default()` |
//! | `#[snapshot(skip, default = path::to_fn)]` | not stored; restored by calling `path::to_fn()` |
//! | `#[snapshot(nested)]` | the field's type is itself `Snapshot` (not serde); it is stored as a complete nested blob, so it keeps its own version and upgrade chain |
//!
//! Attributes on enum variants are rejected. Keys may be combined in one
//! attribute or spread over several; each key may appear once.
//!
//! # Upgrade chains
//!
//! Each step names the previous version's type. Restoring a blob stored with
//! version 1 into `Counter` (version 3) decodes a `CounterV1`, converts it to
//! `CounterV2`, then to `Counter`. A stored version newer than the build, or
//! older than the chain reaches, is a `StateError::VersionMismatch`.
//!
//! ```
//! use snapflow::Snapshot;
//!
//! #[derive(Snapshot)]
//! #[snapshot(name = "Counter")]
//! struct CounterV1 {
//!     count: u32,
//! }
//!
//! #[derive(Snapshot)]
//! #[snapshot(name = "Counter", version = 2, upgrade_from = CounterV1)]
//! struct CounterV2 {
//!     count: u64,
//! }
//!
//! #[derive(Snapshot, Debug, PartialEq)]
//! #[snapshot(version = 3, upgrade_from = CounterV2)]
//! struct Counter {
//!     count: u64,
//!     #[snapshot(skip)]
//!     cache: Vec<u64>,
//! }
//!
//! impl From<CounterV1> for CounterV2 {
//!     fn from(old: CounterV1) -> Self {
//!         CounterV2 { count: u64::from(old.count) }
//!     }
//! }
//!
//! impl From<CounterV2> for Counter {
//!     fn from(old: CounterV2) -> Self {
//!         Counter { count: old.count, cache: Vec::new() }
//!     }
//! }
//!
//! // A blob written by the build that still had version 1.
//! let old = snapflow::state::blob::encode(&CounterV1 { count: 7 }).unwrap();
//! let now: Counter = snapflow::state::blob::decode(&old).unwrap();
//! assert_eq!(now, Counter { count: 7, cache: Vec::new() });
//! ```
//!
//! # Known gaps
//!
//! Field types are recorded as written, so `Vec<T>` is the same schema for
//! every `T`, and a type alias or a renamed import changes the fingerprint
//! although the bytes do not change. The schema of a `nested` field records
//! only that it is nested, not the nested type's own fields; the nested blob
//! carries those.

use proc_macro::TokenStream;

mod bounds;
mod errors;
mod expand;
mod model;
mod parse;
mod validate;

/// Derives `snapflow::state::Snapshot`: the schema, the payload encoding and,
/// with `upgrade_from`, the upgrade chain.
///
/// Attributes: `#[snapshot(version = N, upgrade_from = Old, name = "Name",
/// crate = "path")]` on the type; `#[snapshot(skip)]`,
/// `#[snapshot(skip, default = path::to_fn)]` and `#[snapshot(nested)]` on
/// fields. The `snapflow-macros` crate documentation describes each one.
///
/// ```
/// use snapflow::Snapshot;
///
/// #[derive(Snapshot, Debug, PartialEq)]
/// #[snapshot(version = 2)]
/// enum Phase {
///     Idle,
///     Running { since_ms: u64 },
///     Done(u64, #[snapshot(skip)] Vec<String>),
/// }
///
/// let bytes = snapflow::state::blob::encode(&Phase::Running { since_ms: 5 }).unwrap();
/// let back: Phase = snapflow::state::blob::decode(&bytes).unwrap();
/// assert_eq!(back, Phase::Running { since_ms: 5 });
/// ```
#[proc_macro_derive(Snapshot, attributes(snapshot))]
pub fn derive_snapshot(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    derive(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// Runs the three steps; any error from parse or validate stops before
/// expansion, so a broken input produces only the errors about it.
fn derive(input: &syn::DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let mut errors = errors::Errors::default();
    let raw = parse::parse(input, &mut errors);
    let model = validate::validate(raw, &mut errors);
    errors.finish()?;
    let model = model.ok_or_else(|| {
        syn::Error::new_spanned(&input.ident, "internal error: no model and no error")
    })?;
    Ok(expand::expand(&model))
}
