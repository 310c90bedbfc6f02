//! The validated description of a derive input, the contract between
//! [`crate::validate`] and [`crate::expand`].
//!
//! A model is always consistent: every attribute was known, well-formed and
//! in its place. It holds no tokens of its own making; expansion alone
//! decides what the generated code looks like.

/// A type that passed validation.
pub(crate) struct Model<'a> {
    /// The type's ident.
    pub ident: &'a syn::Ident,
    /// The type's generics as written.
    pub generics: &'a syn::Generics,
    /// The type name recorded in the schema: `name = ".."`, else the ident.
    pub type_name: String,
    /// The schema version, at least 1.
    pub version: u32,
    /// The previous version's type, from `upgrade_from`.
    pub upgrade_from: Option<syn::Type>,
    /// The path of the snapflow crate, `::snapflow` unless overridden.
    pub krate: syn::Path,
    /// The fields or variants.
    pub body: Body<'a>,
}

/// The body of a validated type.
pub(crate) enum Body<'a> {
    /// A struct of any style.
    Struct(Fields<'a>),
    /// An enum; variants in declaration order.
    Enum(Vec<Variant<'a>>),
}

/// One enum variant.
pub(crate) struct Variant<'a> {
    /// The variant's ident.
    pub ident: &'a syn::Ident,
    /// The variant's fields.
    pub fields: Fields<'a>,
}

/// How fields are written in the source.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// `{ name: Type }`
    Named,
    /// `(Type)`
    Tuple,
    /// No fields.
    Unit,
}

/// The fields of a struct or variant.
pub(crate) struct Fields<'a> {
    /// How they are written.
    pub style: Style,
    /// All fields in declaration order, skipped ones included.
    pub list: Vec<Field<'a>>,
}

/// One field.
pub(crate) struct Field<'a> {
    /// Its position in declaration order; generated bindings are named by
    /// it, since names built from field names could break naming lints.
    pub index: usize,
    /// How to access it: a name or a tuple index.
    pub member: syn::Member,
    /// Its name in the schema: the ident without `r#`, or the index.
    pub schema_name: String,
    /// Its type as written.
    pub ty: &'a syn::Type,
    /// How it is stored.
    pub mode: Mode,
}

/// How a field is stored.
pub(crate) enum Mode {
    /// Encoded with postcard through serde.
    Serde,
    /// A nested `Snapshot` blob, from `#[snapshot(nested)]`.
    Nested,
    /// Not stored, from `#[snapshot(skip)]`; restored by calling `default`
    /// or, without it, `Default::default()`.
    Skip {
        /// The function from `default = path`.
        default: Option<syn::ExprPath>,
    },
}

impl Fields<'_> {
    /// The fields that are part of the bytes and the schema.
    pub(crate) fn stored(&self) -> impl Iterator<Item = &Field<'_>> {
        self.list
            .iter()
            .filter(|field| !matches!(field.mode, Mode::Skip { .. }))
    }
}
