//! The error accumulator shared by parsing and validation.
//!
//! It owns nothing but a list of `syn::Error`s; it never decides what is an
//! error. Collecting instead of returning early lets one derive report every
//! mistake in the input at once, each at the span of the user's token.

use quote::ToTokens;
use std::fmt::Display;

/// All errors found so far, combined into one `syn::Error`.
#[derive(Default)]
pub(crate) struct Errors {
    combined: Option<syn::Error>,
}

impl Errors {
    /// Records an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.combined {
            Some(combined) => combined.combine(error),
            None => self.combined = Some(error),
        }
    }

    /// Records an error spanning `tokens`.
    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// `Err` with every recorded error, or `Ok` if there were none.
    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.combined {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
