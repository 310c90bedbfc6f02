//! Step two: check the raw attributes and build a [`Model`].
//!
//! This module owns every rule about `#[snapshot(...)]`: which keys exist,
//! where each may stand, what its value must look like, and which keys need
//! or exclude each other. It reports every broken rule (spanned at the
//! user's token) and keeps going, so one build shows all of them. It never
//! produces tokens for the generated impl.

use crate::errors::Errors;
use crate::model::{Body, Field, Fields, Mode, Model, Style, Variant};
use crate::parse::{RawBody, RawEntry, RawField, RawFields, RawInput};
use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;

/// The keys allowed on the type.
const TYPE_KEYS: &[&str] = &["version", "upgrade_from", "name", "crate"];
/// The keys allowed on a field.
const FIELD_KEYS: &[&str] = &["skip", "default", "nested"];

/// Where an attribute stands; decides which keys are allowed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Type,
    Variant,
    Field,
}

/// Validates `raw`. Returns `None` only if an error was recorded that
/// leaves nothing to model (a union); otherwise the caller must still check
/// `errors` before using the model.
pub(crate) fn validate<'a>(raw: RawInput<'a>, errors: &mut Errors) -> Option<Model<'a>> {
    let attrs = type_attrs(&raw.entries, errors);
    let body = match raw.body {
        RawBody::Struct(fields) => Body::Struct(fields_model(fields, errors)),
        RawBody::Enum(variants) => Body::Enum(
            variants
                .into_iter()
                .map(|variant| {
                    check_keys(&variant.entries, Place::Variant, errors);
                    Variant {
                        ident: &variant.variant.ident,
                        fields: fields_model(variant.fields, errors),
                    }
                })
                .collect(),
        ),
        RawBody::Union(data) => {
            errors.spanned(
                data.union_token,
                "`Snapshot` cannot be derived for unions; use a struct or an enum",
            );
            return None;
        }
    };
    let input = raw.input;
    Some(Model {
        ident: &input.ident,
        generics: &input.generics,
        type_name: attrs
            .name
            .unwrap_or_else(|| input.ident.unraw().to_string()),
        version: attrs.version.map_or(1, |(version, _)| version),
        upgrade_from: attrs.upgrade_from,
        krate: attrs.krate.unwrap_or_else(|| syn::parse_quote!(::snapflow)),
        body,
    })
}

/// The type-level attributes, as far as they were valid.
#[derive(Default)]
struct TypeAttrs {
    /// The version and its literal, for errors that involve it.
    version: Option<(u32, syn::LitInt)>,
    upgrade_from: Option<syn::Type>,
    name: Option<String>,
    krate: Option<syn::Path>,
}

fn type_attrs(entries: &[RawEntry], errors: &mut Errors) -> TypeAttrs {
    let mut attrs = TypeAttrs::default();
    let mut upgrade_key = None;
    for entry in check_keys(entries, Place::Type, errors) {
        let Some(tokens) = required_value(entry, errors) else {
            continue;
        };
        match entry.key.unraw().to_string().as_str() {
            "version" => attrs.version = version_value(tokens, errors),
            "upgrade_from" => {
                upgrade_key = Some(&entry.key);
                attrs.upgrade_from = parse_or(
                    tokens,
                    errors,
                    "`upgrade_from` must name the previous version's type, \
                     e.g. `upgrade_from = CounterV1`",
                );
            }
            "name" => attrs.name = name_value(tokens, errors),
            "crate" => attrs.krate = crate_value(tokens, errors),
            other => unreachable!("check_keys let through the key `{other}`"),
        }
    }
    // A `version` that was given but malformed has its own error already.
    let version_given = entries.iter().any(|entry| entry.key.unraw() == "version");
    if let Some(key) = upgrade_key {
        if version_given == attrs.version.is_some() {
            check_upgrade_version(key, attrs.version.as_ref(), errors);
        }
    }
    attrs
}

/// An upgrade needs a version above the old type's, so at least 2.
fn check_upgrade_version(
    key: &syn::Ident,
    version: Option<&(u32, syn::LitInt)>,
    errors: &mut Errors,
) {
    match version {
        None => errors.spanned(
            key,
            "`upgrade_from` needs `version = N` on the same type, with N above \
             the old type's version, e.g. `#[snapshot(version = 2, upgrade_from = CounterV1)]`",
        ),
        Some((1, literal)) => errors.spanned(
            literal,
            "a type with `upgrade_from` needs `version` of at least 2, above the old type's version",
        ),
        Some(_) => {}
    }
}

fn version_value(tokens: &TokenStream, errors: &mut Errors) -> Option<(u32, syn::LitInt)> {
    const SHAPE: &str = "`version` must be an integer literal of at least 1, e.g. `version = 2`";
    let literal: syn::LitInt = parse_or(tokens, errors, SHAPE)?;
    if !matches!(literal.suffix(), "" | "u32") {
        errors.spanned(&literal, SHAPE);
        return None;
    }
    match literal.base10_parse::<u32>() {
        Ok(0) => {
            errors.spanned(&literal, "`version` starts at 1; 0 is not a valid version");
            None
        }
        Ok(version) => Some((version, literal)),
        Err(_) => {
            errors.spanned(&literal, "`version` must fit in a u32");
            None
        }
    }
}

fn name_value(tokens: &TokenStream, errors: &mut Errors) -> Option<String> {
    const SHAPE: &str =
        "`name` must be a string holding a Rust identifier, e.g. `name = \"Counter\"`";
    let literal: syn::LitStr = parse_or(tokens, errors, SHAPE)?;
    match syn::parse_str::<syn::Ident>(&literal.value()) {
        Ok(ident) => Some(ident.unraw().to_string()),
        Err(_) => {
            errors.spanned(&literal, SHAPE);
            None
        }
    }
}

fn crate_value(tokens: &TokenStream, errors: &mut Errors) -> Option<syn::Path> {
    const SHAPE: &str = "`crate` must be a string holding a path to the snapflow crate, \
                         e.g. `crate = \"snapflow\"` or `crate = \"::my_lib::snapflow\"`";
    let literal: syn::LitStr = parse_or(tokens, errors, SHAPE)?;
    match literal.parse::<syn::Path>() {
        Ok(path) => Some(path),
        Err(_) => {
            errors.spanned(&literal, SHAPE);
            None
        }
    }
}

fn fields_model<'a>(raw: RawFields<'a>, errors: &mut Errors) -> Fields<'a> {
    let style = match raw.fields {
        syn::Fields::Named(_) => Style::Named,
        syn::Fields::Unnamed(_) => Style::Tuple,
        syn::Fields::Unit => Style::Unit,
    };
    let list = raw
        .list
        .into_iter()
        .map(|field| field_model(field, errors))
        .collect();
    Fields { style, list }
}

fn field_model<'a>(raw: RawField<'a>, errors: &mut Errors) -> Field<'a> {
    let (member, schema_name) = match &raw.field.ident {
        Some(ident) => (syn::Member::Named(ident.clone()), ident.unraw().to_string()),
        None => {
            let index = syn::Index {
                index: raw.index as u32,
                span: Span::call_site(),
            };
            (syn::Member::Unnamed(index), raw.index.to_string())
        }
    };
    Field {
        index: raw.index,
        member,
        schema_name,
        ty: &raw.field.ty,
        mode: field_mode(&raw.entries, errors),
    }
}

fn field_mode(entries: &[RawEntry], errors: &mut Errors) -> Mode {
    let (mut skip, mut nested, mut default) = (None, None, None);
    for entry in check_keys(entries, Place::Field, errors) {
        match entry.key.unraw().to_string().as_str() {
            "skip" => skip = flag(entry, errors).then_some(&entry.key),
            "nested" => nested = flag(entry, errors).then_some(&entry.key),
            "default" => {
                default = Some((
                    &entry.key,
                    required_value(entry, errors).and_then(|tokens| {
                        parse_or::<syn::ExprPath>(
                            tokens,
                            errors,
                            "`default` must be a path to a function that returns the \
                             field's type, e.g. `default = Vec::new`",
                        )
                    }),
                ))
            }
            other => unreachable!("check_keys let through the key `{other}`"),
        }
    }
    if let (Some(_), Some(key)) = (skip, nested) {
        errors.spanned(
            key,
            "a field cannot be both `skip` and `nested`; a skipped field is not stored at all",
        );
    }
    match (skip, default) {
        (None, Some((key, _))) => {
            errors.spanned(
                key,
                "`default` only applies to skipped fields; write `#[snapshot(skip, default = ...)]`",
            );
            Mode::Serde
        }
        (Some(_), default) => Mode::Skip {
            default: default.and_then(|(_, path)| path),
        },
        (None, None) if nested.is_some() => Mode::Nested,
        (None, None) => Mode::Serde,
    }
}

/// Reports unknown, misplaced and duplicate keys, and returns the entries
/// that are allowed here, each key once.
fn check_keys<'e>(entries: &'e [RawEntry], place: Place, errors: &mut Errors) -> Vec<&'e RawEntry> {
    let mut accepted: Vec<&RawEntry> = Vec::new();
    for entry in entries {
        let key = entry.key.unraw().to_string();
        if let Some(message) = misplaced(&key, place) {
            errors.spanned(&entry.key, message);
        } else if accepted
            .iter()
            .any(|seen| seen.key.unraw() == entry.key.unraw())
        {
            errors.spanned(
                &entry.key,
                format!("duplicate `{key}`; each snapshot attribute key may appear only once here"),
            );
        } else {
            accepted.push(entry);
        }
    }
    accepted
}

/// Why `key` may not stand at `place`, or `None` if it may.
fn misplaced(key: &str, place: Place) -> Option<String> {
    let on_type = TYPE_KEYS.contains(&key);
    let on_field = FIELD_KEYS.contains(&key);
    match place {
        Place::Variant => {
            let hint = match (on_type, on_field) {
                (true, _) => format!("; `{key}` belongs on the enum itself"),
                (_, true) => format!("; `{key}` belongs on a field"),
                _ => String::new(),
            };
            Some(format!(
                "snapshot attributes are not supported on enum variants{hint}"
            ))
        }
        _ if !on_type && !on_field => {
            let expected = if place == Place::Field {
                FIELD_KEYS
            } else {
                TYPE_KEYS
            };
            let expected: Vec<String> = expected.iter().map(|key| format!("`{key}`")).collect();
            Some(format!(
                "unknown snapshot attribute `{key}`; expected one of {}",
                expected.join(", ")
            ))
        }
        Place::Type if on_field => Some(format!(
            "`{key}` applies to fields, not to the type; put it in a `#[snapshot(...)]` on a field"
        )),
        Place::Field if on_type => Some(format!(
            "`{key}` applies to the type, not to a field; put it in a `#[snapshot(...)]` above the type"
        )),
        _ => None,
    }
}

/// Whether `entry` is a bare flag; reports a value given to it.
fn flag(entry: &RawEntry, errors: &mut Errors) -> bool {
    match &entry.value {
        None => true,
        Some(value) => {
            let key = &entry.key;
            errors.spanned(
                {
                    let (eq, tokens) = (&value.eq, &value.tokens);
                    quote::quote!(#eq #tokens)
                },
                format!("`{key}` takes no value; write `#[snapshot({key})]`"),
            );
            false
        }
    }
}

/// The value tokens of `entry`; reports a missing or empty value.
fn required_value<'e>(entry: &'e RawEntry, errors: &mut Errors) -> Option<&'e TokenStream> {
    let key = &entry.key;
    match &entry.value {
        None => {
            errors.spanned(key, format!("`{key}` needs a value: `{key} = ...`"));
            None
        }
        Some(value) if value.tokens.is_empty() => {
            errors.spanned(value.eq, format!("expected a value after `{key} =`"));
            None
        }
        Some(value) => Some(&value.tokens),
    }
}

/// Parses `tokens` as exactly one `T`, or reports `message` spanning them.
fn parse_or<T: syn::parse::Parse>(
    tokens: &TokenStream,
    errors: &mut Errors,
    message: &str,
) -> Option<T> {
    match syn::parse2::<T>(tokens.clone()) {
        Ok(value) => Some(value),
        Err(_) => {
            errors.spanned(tokens, message);
            None
        }
    }
}
