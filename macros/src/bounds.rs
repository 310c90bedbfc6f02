//! The where-clause bounds a generic type's impl needs.
//!
//! Bounds are added per field type, serde-style but on the whole field type
//! rather than on each parameter: `Vec<T>: Serialize + DeserializeOwned`
//! instead of `T: Serialize + ...`, so `PhantomData<T>` or `Rc<T>` fields
//! need exactly what their own impls need. Only field types that mention a
//! type or const parameter get a bound; the others are concrete, so the
//! compiler checks them in the function bodies, at the field's span. This
//! module never looks at attributes; it reads the validated model.

use crate::model::{Body, Field, Mode, Model};
use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, ToTokens};

/// The type's generics with the bounds its `Snapshot` impl needs added to
/// the where clause.
pub(crate) fn with_bounds(model: &Model<'_>) -> syn::Generics {
    let mut generics = model.generics.clone();
    let params: Vec<&syn::Ident> = model
        .generics
        .params
        .iter()
        .filter_map(|param| match param {
            syn::GenericParam::Type(param) => Some(&param.ident),
            syn::GenericParam::Const(param) => Some(&param.ident),
            syn::GenericParam::Lifetime(_) => None,
        })
        .collect();
    if params.is_empty() {
        return generics;
    }
    let mut predicates: Vec<syn::WherePredicate> = Vec::new();
    let mut add = |predicate: syn::WherePredicate| {
        let text = predicate.to_token_stream().to_string();
        if !predicates
            .iter()
            .any(|seen| seen.to_token_stream().to_string() == text)
        {
            predicates.push(predicate);
        }
    };
    for field in all_fields(model) {
        if mentions(field.ty.to_token_stream(), &params) {
            if let Some(predicate) = field_predicate(model, field) {
                add(predicate);
            }
        }
    }
    if let Some(old) = &model.upgrade_from {
        if mentions(old.to_token_stream(), &params) {
            for predicate in upgrade_predicates(model, old) {
                add(predicate);
            }
        }
    }
    generics.make_where_clause().predicates.extend(predicates);
    generics
}

fn all_fields<'m>(model: &'m Model<'_>) -> Box<dyn Iterator<Item = &'m Field<'m>> + 'm> {
    match &model.body {
        Body::Struct(fields) => Box::new(fields.list.iter()),
        Body::Enum(variants) => Box::new(
            variants
                .iter()
                .flat_map(|variant| variant.fields.list.iter()),
        ),
    }
}

/// What one field's type must implement for the generated code to compile.
/// A skipped field with a `default` function needs nothing: the function's
/// return type is checked against the field where it is called.
fn field_predicate(model: &Model<'_>, field: &Field<'_>) -> Option<syn::WherePredicate> {
    let private = private_path(model);
    let ty = field.ty;
    match &field.mode {
        Mode::Serde => Some(syn::parse_quote!(
            #ty: #private::Serialize + #private::DeserializeOwned
        )),
        Mode::Nested => Some(syn::parse_quote!(#ty: #private::Snapshot)),
        Mode::Skip { default: Some(_) } => None,
        Mode::Skip { default: None } => Some(syn::parse_quote!(#ty: #private::Default)),
    }
}

fn upgrade_predicates(model: &Model<'_>, old: &syn::Type) -> [syn::WherePredicate; 2] {
    let private = private_path(model);
    let ident = model.ident;
    let (_, type_generics, _) = model.generics.split_for_impl();
    [
        syn::parse_quote!(#old: #private::Snapshot),
        syn::parse_quote!(#ident #type_generics: #private::From<#old>),
    ]
}

/// `<crate>::__private`, the only path generated code names.
pub(crate) fn private_path(model: &Model<'_>) -> TokenStream {
    let krate = &model.krate;
    quote!(#krate::__private)
}

/// Whether `tokens` contain one of `params` as an ident, at any depth. A
/// token walk rather than a type visitor: it also sees parameters inside
/// macro invocations in types, and a false positive only adds a bound that
/// holds anyway.
fn mentions(tokens: TokenStream, params: &[&syn::Ident]) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => params.iter().any(|param| **param == ident),
        TokenTree::Group(group) => mentions(group.stream(), params),
        TokenTree::Punct(_) | TokenTree::Literal(_) => false,
    })
}
