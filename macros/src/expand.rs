//! Step three: turn a validated [`Model`] into the `Snapshot` impl.
//!
//! This module owns the shape of the generated code and nothing else: every
//! item it names goes through `<crate>::__private`, so the generated impl
//! compiles where prelude names are shadowed or absent, and the byte format
//! stays in the runtime helpers. Calls that depend on a field's type carry
//! that type's span, so a missing `Serialize` or `Snapshot` impl is reported
//! at the field. Local names start with `__snapflow_` so they cannot clash
//! with field names, and with `_` so unused ones do not warn.

use crate::bounds::{private_path, with_bounds};
use crate::model::{Body, Field, Fields, Mode, Model, Style, Variant};
use proc_macro2::{Group, Literal, Span, TokenStream, TokenTree};
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::spanned::Spanned;

/// The whole generated impl.
pub(crate) fn expand(model: &Model<'_>) -> TokenStream {
    let private = private_path(model);
    let generics = with_bounds(model);
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let (_, type_generics, _) = model.generics.split_for_impl();
    let ident = model.ident;
    let schema = schema(model, &private);
    let encode = encode_body(model, &private);
    let decode = decode_body(model, &private);
    let decode_stored = model
        .upgrade_from
        .as_ref()
        .map(|old| decode_stored(old, &private));
    quote! {
        #[automatically_derived]
        impl #impl_generics #private::Snapshot for #ident #type_generics #where_clause {
            const SCHEMA: #private::Schema = #schema;

            fn encode_payload(
                &self,
                __snapflow_out: &mut #private::Vec<#private::u8>,
            ) -> #private::Result<(), #private::StateError> {
                #encode
            }

            fn decode_payload(
                __snapflow_payload: &[#private::u8],
            ) -> #private::Result<Self, #private::StateError> {
                #decode
            }

            #decode_stored
        }
    }
}

fn schema(model: &Model<'_>, private: &TokenStream) -> TokenStream {
    let type_name = &model.type_name;
    let version = Literal::u32_suffixed(model.version);
    let shape = match &model.body {
        Body::Struct(fields) => {
            let list = field_schemas(fields, private);
            match fields.style {
                Style::Named => quote!(#private::SchemaShape::Named(&[#(#list),*])),
                Style::Tuple => quote!(#private::SchemaShape::Tuple(&[#(#list),*])),
                Style::Unit => quote!(#private::SchemaShape::Unit),
            }
        }
        Body::Enum(variants) => {
            let variants = variants.iter().map(|variant| {
                let name = variant.ident.unraw().to_string();
                let list = field_schemas(&variant.fields, private);
                quote!(#private::VariantSchema { name: #name, fields: &[#(#list),*] })
            });
            quote!(#private::SchemaShape::Enum(&[#(#variants),*]))
        }
    };
    quote! {
        #private::Schema {
            type_name: #type_name,
            version: #version,
            shape: #shape,
        }
    }
}

fn field_schemas(fields: &Fields<'_>, private: &TokenStream) -> Vec<TokenStream> {
    fields
        .stored()
        .map(|field| {
            let name = &field.schema_name;
            let type_name = match field.mode {
                // Nested fields are encoded differently from serde fields of
                // the same type, so the schema must tell them apart.
                Mode::Nested => format!("#[nested] {}", type_text(field.ty)),
                _ => type_text(field.ty),
            };
            quote!(#private::FieldSchema { name: #name, type_name: #type_name })
        })
        .collect()
}

/// The field's type as written, with the spacing of `to_string()` reduced to
/// what is needed to read it: a space only between two words (`dyn Trait`,
/// `&'a mut T`) and after a comma. The fingerprint ignores all whitespace, so
/// this only makes error messages readable.
pub(crate) fn type_text(ty: &syn::Type) -> String {
    let raw = quote!(#ty).to_string();
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut text = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c != ' ' {
            text.push(c);
            continue;
        }
        let before = text.chars().last();
        let after = chars.peek().copied();
        let between_words = before.is_some_and(is_word) && after.is_some_and(is_word);
        if between_words || matches!(before, Some(',' | ';')) {
            text.push(' ');
        }
    }
    text
}

/// The binding a stored field gets while encoding or decoding.
fn binding(field: &Field<'_>) -> syn::Ident {
    format_ident!("__snapflow_field_{}", field.index)
}

/// One field's encode call, spanned at the field's type.
fn encode_field(
    field: &Field<'_>,
    value: TokenStream,
    type_name: &str,
    private: &TokenStream,
) -> TokenStream {
    let call = match field.mode {
        Mode::Serde => quote!(#private::encode_field(#type_name, #value, __snapflow_out)?;),
        Mode::Nested => quote!(#private::encode_nested(#type_name, #value, __snapflow_out)?;),
        Mode::Skip { .. } => return TokenStream::new(),
    };
    respan(call, field.ty.span())
}

fn encode_body(model: &Model<'_>, private: &TokenStream) -> TokenStream {
    let type_name = model.type_name.as_str();
    match &model.body {
        Body::Struct(fields) => {
            let calls = fields.stored().map(|field| {
                let member = &field.member;
                encode_field(field, quote!(&self.#member), type_name, private)
            });
            quote! {
                #(#calls)*
                #private::Result::Ok(())
            }
        }
        // Matching on `*self` with no arms is how an uninhabited type's
        // function body diverges without unreachable code after it.
        Body::Enum(variants) if variants.is_empty() => quote!(match *self {}),
        Body::Enum(variants) => {
            let arms = variants.iter().enumerate().map(|(index, variant)| {
                let pattern = variant_pattern(variant);
                let index = Literal::u32_suffixed(index as u32);
                let calls = variant.fields.stored().map(|field| {
                    let value = binding(field);
                    encode_field(field, quote!(#value), type_name, private)
                });
                quote! {
                    #pattern => {
                        #private::encode_variant(#type_name, #index, __snapflow_out)?;
                        #(#calls)*
                        #private::Result::Ok(())
                    }
                }
            });
            quote!(match self { #(#arms)* })
        }
    }
}

/// `Self::Variant { name: binding, skipped: _ }`; tuple variants use the
/// same braced form with index members.
fn variant_pattern(variant: &Variant<'_>) -> TokenStream {
    let ident = variant.ident;
    if variant.fields.style == Style::Unit {
        return quote!(Self::#ident);
    }
    let members = variant.fields.list.iter().map(|field| {
        let member = &field.member;
        match field.mode {
            Mode::Skip { .. } => quote!(#member: _),
            _ => {
                let value = binding(field);
                quote!(#member: #value)
            }
        }
    });
    quote!(Self::#ident { #(#members),* })
}

fn decode_body(model: &Model<'_>, private: &TokenStream) -> TokenStream {
    let type_name = model.type_name.as_str();
    match &model.body {
        Body::Struct(fields) => {
            let reads = decode_fields(fields, type_name, private);
            let value = construct(quote!(Self), fields, private);
            // `mut` only when a field reads from the input, so a struct with
            // nothing stored does not warn about an unused `mut`.
            let mutability = fields.stored().next().map(|_| quote!(mut));
            quote! {
                let #mutability __snapflow_input: &[#private::u8] = __snapflow_payload;
                #reads
                #private::finish(#type_name, __snapflow_input)?;
                #private::Result::Ok(#value)
            }
        }
        Body::Enum(variants) => decode_enum(variants, type_name, private),
    }
}

fn decode_enum(variants: &[Variant<'_>], type_name: &str, private: &TokenStream) -> TokenStream {
    let read_index = quote! {
        let mut __snapflow_input: &[#private::u8] = __snapflow_payload;
        let __snapflow_index = #private::decode_variant(#type_name, &mut __snapflow_input)?;
    };
    let unknown =
        quote!(#private::Result::Err(#private::unknown_variant(#type_name, __snapflow_index)));
    if variants.is_empty() {
        return quote!(#read_index #unknown);
    }
    let arms = variants.iter().enumerate().map(|(index, variant)| {
        let index = Literal::u32_suffixed(index as u32);
        let reads = decode_fields(&variant.fields, type_name, private);
        let ident = variant.ident;
        let value = construct(quote!(Self::#ident), &variant.fields, private);
        quote!(#index => { #reads #value })
    });
    quote! {
        #read_index
        let __snapflow_value = match __snapflow_index {
            #(#arms)*
            _ => return #unknown,
        };
        #private::finish(#type_name, __snapflow_input)?;
        #private::Result::Ok(__snapflow_value)
    }
}

/// `let` statements reading each stored field in order, spanned at the
/// field's type.
fn decode_fields(fields: &Fields<'_>, type_name: &str, private: &TokenStream) -> TokenStream {
    let reads = fields.stored().map(|field| {
        let value = binding(field);
        let ty = field.ty;
        let helper = match field.mode {
            Mode::Nested => quote!(#private::decode_nested),
            _ => quote!(#private::decode_field),
        };
        let read = quote!(#helper(#type_name, &mut __snapflow_input)?);
        let read = respan(read, ty.span());
        quote!(let #value: #ty = #read;)
    });
    quote!(#(#reads)*)
}

/// The value built from decoded bindings and the defaults of skipped fields.
fn construct(path: TokenStream, fields: &Fields<'_>, private: &TokenStream) -> TokenStream {
    if fields.style == Style::Unit {
        return path;
    }
    let members = fields.list.iter().map(|field| {
        let member = &field.member;
        let value = match &field.mode {
            Mode::Skip {
                default: Some(function),
            } => respan(quote!(#function()), function.span()),
            Mode::Skip { default: None } => {
                respan(quote!(#private::Default::default()), field.ty.span())
            }
            _ => {
                let value = binding(field);
                quote!(#value)
            }
        };
        quote!(#member: #value)
    });
    quote!(#path { #(#members),* })
}

/// `decode_stored` for a type with `upgrade_from`: a compile-time check that
/// versions fall along the chain, then the runtime helper. Both are spanned
/// at the old type, where a missing `From` or `Snapshot` impl belongs.
fn decode_stored(old: &syn::Type, private: &TokenStream) -> TokenStream {
    let check = respan(
        quote! {
            let () = const {
                #private::check_upgrade_versions(
                    <#old as #private::Snapshot>::SCHEMA.version,
                    <Self as #private::Snapshot>::SCHEMA.version,
                )
            };
        },
        old.span(),
    );
    let call = respan(
        quote!(#private::decode_with_upgrade::<Self, #old>(__snapflow_stored, __snapflow_payload)),
        old.span(),
    );
    quote! {
        fn decode_stored(
            __snapflow_stored: &#private::StoredSchema,
            __snapflow_payload: &[#private::u8],
        ) -> #private::Result<Self, #private::StateError> {
            #check
            #call
        }
    }
}

/// `tokens` with every span set to `span`, so that an error in code that
/// depends on a user's type (a missing trait impl) is reported at that type
/// rather than at `#[derive(Snapshot)]`. Only the location changes: derive
/// output resolves names at the call site whatever the span, so hygiene is
/// unaffected.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tree| match tree {
            TokenTree::Group(group) => {
                let mut respanned = Group::new(group.delimiter(), respan(group.stream(), span));
                respanned.set_span(span);
                TokenTree::Group(respanned)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::type_text;

    fn check(source: &str, expected: &str) {
        let ty: syn::Type = syn::parse_str(source).expect("a type");
        assert_eq!(type_text(&ty), expected, "for {source:?}");
    }

    #[test]
    fn type_text_drops_spacing_around_punctuation() {
        check("Vec < u64 >", "Vec<u64>");
        check(
            "std :: collections :: HashMap<String,u64>",
            "std::collections::HashMap<String, u64>",
        );
        check("[u8 ; 4]", "[u8; 4]");
        check("<T as Iterator>::Item", "<T as Iterator>::Item");
    }

    #[test]
    fn type_text_keeps_spaces_between_words() {
        check("&'a mut T", "&'a mut T");
        check("Box<dyn Fn(u8) -> u8 + Send>", "Box<dyn Fn(u8)->u8+Send>");
    }
}
