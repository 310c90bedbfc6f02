//! Step one: read the derive input into raw form.
//!
//! This module owns the syntax of `#[snapshot(...)]`: a comma-separated list
//! of `key` or `key = value` entries. It keeps every key as written and every
//! value as raw tokens, and never judges whether a key is known, allowed
//! where it stands, or well-formed; that is [`crate::validate`]'s job, so
//! that all such mistakes are reported together and with the same wording.

use crate::errors::Errors;
use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::Token;

/// One `key` or `key = value` entry of a `#[snapshot(...)]` attribute.
pub(crate) struct RawEntry {
    /// The key as written; keywords such as `crate` are allowed.
    pub key: syn::Ident,
    /// The value, if the key had `= ...`.
    pub value: Option<RawValue>,
}

/// The `= value` part of an entry, kept as tokens until validation.
pub(crate) struct RawValue {
    /// The `=` token, used to place errors about a missing value.
    pub eq: Token![=],
    /// Everything up to the next top-level comma.
    pub tokens: TokenStream,
}

/// The derive input with its attributes read.
pub(crate) struct RawInput<'a> {
    /// The whole input, for its ident, generics and keyword spans.
    pub input: &'a syn::DeriveInput,
    /// The entries of attributes on the type.
    pub entries: Vec<RawEntry>,
    /// The fields or variants.
    pub body: RawBody<'a>,
}

/// The body of the input.
pub(crate) enum RawBody<'a> {
    /// A struct of any style.
    Struct(RawFields<'a>),
    /// An enum.
    Enum(Vec<RawVariant<'a>>),
    /// A union, which the derive rejects.
    Union(&'a syn::DataUnion),
}

/// One enum variant with its attributes read.
pub(crate) struct RawVariant<'a> {
    /// The variant as written.
    pub variant: &'a syn::Variant,
    /// The entries of attributes on the variant (all of them are errors).
    pub entries: Vec<RawEntry>,
    /// The variant's fields.
    pub fields: RawFields<'a>,
}

/// The fields of a struct or variant with their attributes read.
pub(crate) struct RawFields<'a> {
    /// The fields as written, for their style.
    pub fields: &'a syn::Fields,
    /// One entry per field, in declaration order.
    pub list: Vec<RawField<'a>>,
}

/// One field with its attributes read.
pub(crate) struct RawField<'a> {
    /// The position in declaration order, the name of a tuple field.
    pub index: usize,
    /// The field as written.
    pub field: &'a syn::Field,
    /// The entries of attributes on the field.
    pub entries: Vec<RawEntry>,
}

/// Reads the input's attributes; syntax errors go to `errors`.
pub(crate) fn parse<'a>(input: &'a syn::DeriveInput, errors: &mut Errors) -> RawInput<'a> {
    let entries = entries_of(&input.attrs, errors);
    let body = match &input.data {
        syn::Data::Struct(data) => RawBody::Struct(fields_of(&data.fields, errors)),
        syn::Data::Enum(data) => RawBody::Enum(
            data.variants
                .iter()
                .map(|variant| RawVariant {
                    variant,
                    entries: entries_of(&variant.attrs, errors),
                    fields: fields_of(&variant.fields, errors),
                })
                .collect(),
        ),
        syn::Data::Union(data) => RawBody::Union(data),
    };
    RawInput {
        input,
        entries,
        body,
    }
}

fn fields_of<'a>(fields: &'a syn::Fields, errors: &mut Errors) -> RawFields<'a> {
    let list = fields
        .iter()
        .enumerate()
        .map(|(index, field)| RawField {
            index,
            field,
            entries: entries_of(&field.attrs, errors),
        })
        .collect();
    RawFields { fields, list }
}

/// The entries of every `#[snapshot(...)]` among `attrs`. A syntax error
/// drops the rest of that one attribute but keeps the entries before it.
fn entries_of(attrs: &[syn::Attribute], errors: &mut Errors) -> Vec<RawEntry> {
    let mut entries = Vec::new();
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("snapshot")) {
        match &attr.meta {
            syn::Meta::List(list) => {
                let parser = |stream: ParseStream<'_>| parse_entries(stream, &mut entries);
                if let Err(error) = parser.parse2(list.tokens.clone()) {
                    errors.push(error);
                }
            }
            other => errors.spanned(
                other,
                "expected `#[snapshot(...)]` with keys in parentheses, \
                 e.g. `#[snapshot(version = 2)]`",
            ),
        }
    }
    entries
}

fn parse_entries(stream: ParseStream<'_>, entries: &mut Vec<RawEntry>) -> syn::Result<()> {
    while !stream.is_empty() {
        if !stream.peek(syn::Ident::peek_any) {
            return Err(stream.error("expected a snapshot attribute key, e.g. `version` or `skip`"));
        }
        let key = stream.call(syn::Ident::parse_any)?;
        let value = if stream.peek(Token![=]) {
            let eq = stream.parse()?;
            let tokens = value_tokens(stream)?;
            Some(RawValue { eq, tokens })
        } else {
            None
        };
        entries.push(RawEntry { key, value });
        if !stream.is_empty() {
            stream.parse::<Token![,]>()?;
        }
    }
    Ok(())
}

/// Takes the tokens of one value: everything up to the next comma that is
/// not inside angle brackets, so `upgrade_from = Old<A, B>` stays whole.
/// Angle brackets are not token groups, so they are counted by hand; the `>`
/// of an arrow (`->`) does not close one.
fn value_tokens(stream: ParseStream<'_>) -> syn::Result<TokenStream> {
    stream.step(|cursor| {
        let mut rest = *cursor;
        let mut tokens = TokenStream::new();
        let mut angle_depth = 0usize;
        let mut after_joint_dash = false;
        while let Some((tree, next)) = rest.token_tree() {
            if let TokenTree::Punct(punct) = &tree {
                match punct.as_char() {
                    ',' if angle_depth == 0 => break,
                    '<' => angle_depth += 1,
                    '>' if !after_joint_dash => angle_depth = angle_depth.saturating_sub(1),
                    _ => {}
                }
            }
            after_joint_dash = matches!(
                &tree,
                TokenTree::Punct(punct) if punct.as_char() == '-' && punct.spacing() == Spacing::Joint
            );
            tokens.extend([tree]);
            rest = next;
        }
        Ok((tokens, rest))
    })
}

#[cfg(test)]
mod tests {
    use super::{parse, RawBody};
    use crate::errors::Errors;

    /// The `key=value` texts of the type-level entries of `input`.
    fn entries(input: syn::DeriveInput) -> Vec<String> {
        let mut errors = Errors::default();
        let raw = parse(&input, &mut errors);
        assert!(errors.finish().is_ok());
        raw.entries
            .iter()
            .map(|entry| match &entry.value {
                Some(value) => format!("{}={}", entry.key, value.tokens),
                None => entry.key.to_string(),
            })
            .collect()
    }

    #[test]
    fn commas_inside_angle_brackets_stay_in_the_value() {
        let input = syn::parse_quote! {
            #[snapshot(upgrade_from = Old<A, B>, version = 2)]
            struct New;
        };
        assert_eq!(entries(input), ["upgrade_from=Old < A , B >", "version=2"]);
    }

    #[test]
    fn arrow_does_not_close_an_angle_bracket() {
        let input = syn::parse_quote! {
            #[snapshot(upgrade_from = Old<fn() -> u8, B>, crate = "sf")]
            #[snapshot(skip)]
            struct New;
        };
        assert_eq!(
            entries(input),
            [
                "upgrade_from=Old < fn () -> u8 , B >",
                "crate=\"sf\"",
                "skip"
            ]
        );
    }

    #[test]
    fn syntax_error_keeps_earlier_entries_of_the_attribute() {
        let input: syn::DeriveInput = syn::parse_quote! {
            #[snapshot(version = 2, 7)]
            enum New {}
        };
        let mut errors = Errors::default();
        let raw = parse(&input, &mut errors);
        assert_eq!(raw.entries.len(), 1);
        assert!(matches!(raw.body, RawBody::Enum(_)));
        let message = errors.finish().unwrap_err().to_string();
        assert!(
            message.contains("expected a snapshot attribute key"),
            "{message}"
        );
    }
}
