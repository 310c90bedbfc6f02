// Shapes that must compile without a single warning in surroundings that
// break careless generated code: no prelude, shadowed prelude names, the
// crate under another name, lifetimes, and generic upgrade chains.
#![deny(warnings)]

extern crate snapflow as sf;

/// No prelude at all: generated code must name everything by full path.
mod bare {
    #![no_implicit_prelude]

    #[derive(::snapflow::Snapshot)]
    pub struct Plain {
        pub count: u64,
        pub seen: ::std::vec::Vec<u64>,
    }

    #[derive(::snapflow::Snapshot)]
    pub enum Choice<T: ::std::clone::Clone>
    where
        T: ::std::fmt::Debug,
    {
        Nothing,
        One(T),
        Named {
            x: u8,
            #[snapshot(skip)]
            y: ::std::string::String,
        },
    }

    #[derive(::sf::Snapshot)]
    #[snapshot(crate = "::sf")]
    pub struct Unit;

    #[derive(::snapflow::Snapshot)]
    pub enum Never {}
}

/// Every prelude name the generated code might use, shadowed.
#[allow(dead_code, non_camel_case_types)]
mod shadowed {
    use sf::Snapshot;

    pub struct Vec;
    pub struct Result;
    pub struct Ok;
    pub struct Err;
    pub struct Default;
    pub struct From;
    pub struct Option;
    pub struct u8;
    pub struct str;
    pub mod snapflow {}

    #[derive(Snapshot)]
    #[snapshot(crate = "sf")]
    pub struct Shadowed {
        pub count: u64,
        #[snapshot(skip)]
        pub cache: std::vec::Vec<u64>,
    }

    /// The default path is absolute, so the local `snapflow` is not used.
    #[derive(::snapflow::Snapshot)]
    pub struct Absolute(pub u64);
}

/// Lifetimes are allowed as long as no stored field borrows.
#[derive(sf::Snapshot)]
#[snapshot(crate = "sf")]
struct Borrowing<'a> {
    count: u64,
    #[snapshot(skip)]
    name: Option<&'a str>,
}

/// A generic upgrade chain: the bounds follow the old type's parameters.
#[derive(sf::Snapshot, Debug, PartialEq)]
#[snapshot(crate = "sf", name = "Window")]
struct WindowV1<T> {
    items: Vec<T>,
}

#[derive(sf::Snapshot, Debug, PartialEq)]
#[snapshot(crate = "sf", version = 2, upgrade_from = WindowV1<T>)]
struct Window<T: Clone>
where
    T: Default,
{
    items: Vec<T>,
    limit: usize,
}

impl<T: Clone + Default> From<WindowV1<T>> for Window<T> {
    fn from(old: WindowV1<T>) -> Self {
        Window {
            limit: old.items.len(),
            items: old.items,
        }
    }
}

/// A public type with a private generic field type: the where-clause bound
/// on `Hidden<T>` must not trip the `private_bounds` lint.
pub mod visibility {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Hidden<T>(T);

    #[derive(sf::Snapshot)]
    #[snapshot(crate = "sf")]
    pub struct Public<T> {
        hidden: Hidden<T>,
    }

    impl<T> Public<T> {
        pub fn new(value: T) -> Self {
            Public { hidden: Hidden(value) }
        }

        pub fn get(&self) -> &T {
            &self.hidden.0
        }
    }
}

fn main() {
    use sf::state::blob;

    let bytes = blob::encode(&bare::Plain { count: 1, seen: vec![2] }).unwrap();
    let plain: bare::Plain = blob::decode(&bytes).unwrap();
    assert_eq!((plain.count, plain.seen), (1, vec![2]));

    let bytes = blob::encode(&bare::Choice::One(5u8)).unwrap();
    assert!(matches!(blob::decode(&bytes).unwrap(), bare::Choice::One(5u8)));
    let bytes = blob::encode(&bare::Unit).unwrap();
    let _: bare::Unit = blob::decode(&bytes).unwrap();
    let empty = blob::decode::<bare::Never>(&blob::encode(&bare::Unit).unwrap());
    assert!(empty.is_err());

    let value = shadowed::Shadowed { count: 3, cache: vec![1] };
    let back: shadowed::Shadowed = blob::decode(&blob::encode(&value).unwrap()).unwrap();
    assert_eq!((back.count, back.cache.len()), (3, 0));
    let back: shadowed::Absolute = blob::decode(&blob::encode(&shadowed::Absolute(6)).unwrap()).unwrap();
    assert_eq!(back.0, 6);

    let name = String::from("live");
    let value = Borrowing { count: 4, name: Some(&name) };
    let back: Borrowing<'_> = blob::decode(&blob::encode(&value).unwrap()).unwrap();
    assert_eq!((back.count, back.name), (4, None));

    let bytes = blob::encode(&visibility::Public::new(8u16)).unwrap();
    let public: visibility::Public<u16> = blob::decode(&bytes).unwrap();
    assert_eq!(*public.get(), 8);

    let old = blob::encode(&WindowV1 { items: vec![1u32, 2, 3] }).unwrap();
    let now: Window<u32> = blob::decode(&old).unwrap();
    assert_eq!(now, Window { items: vec![1, 2, 3], limit: 3 });
}
