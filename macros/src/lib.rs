//! `#[derive(Snapshot)]` for snapflow. Placeholder until the derive lands.
use proc_macro::TokenStream;

/// Derives `snapflow::Snapshot`.
#[proc_macro_derive(Snapshot, attributes(snapshot))]
pub fn derive_snapshot(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}
