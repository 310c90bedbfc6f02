//! Runtime tests of `#[derive(Snapshot)]`: every supported shape round-trips
//! through a real blob, schemas have the expected canonical text, and the
//! restore errors (version, schema, payload) are the typed ones with
//! messages that name what differs.
//!
//! Compile errors and a few extra shapes are covered by `tests/ui.rs`.

// Lets `#[snapshot(crate = "sf")]` name the crate by another path; an
// `extern crate` at the crate root puts `sf` in every module's scope.
extern crate snapflow as sf;

use serde::{Deserialize, Serialize};
use snapflow::state::{blob, FieldSchema, Schema, SchemaShape, StateError};
use snapflow::Snapshot;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;

/// Encodes `value` as a blob, decodes it back and compares.
fn round_trip<T: Snapshot + PartialEq + Debug>(value: T) {
    let bytes = blob::encode(&value).expect("encode");
    let back: T = blob::decode(&bytes).expect("decode");
    assert_eq!(back, value);
}

/// Encodes `value`, decodes it as `Expected`, and returns the result.
fn restore_as<Stored: Snapshot, Expected: Snapshot>(
    value: &Stored,
) -> Result<Expected, StateError> {
    blob::decode(&blob::encode(value).expect("encode"))
}

fn canonical<T: Snapshot>() -> String {
    T::SCHEMA.canonical_text()
}

// ---------------------------------------------------------------- shapes

#[derive(Snapshot, Debug, PartialEq, Clone)]
struct Counter {
    count: u64,
    seen: Vec<u64>,
}

#[derive(Snapshot, Debug, PartialEq)]
struct Pair(u32, String);

#[derive(Snapshot, Debug, PartialEq)]
struct Marker;

#[derive(Snapshot, Debug, PartialEq)]
struct EmptyBraces {}

#[derive(Snapshot, Debug, PartialEq)]
struct EmptyParens();

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Point {
    x: i32,
    y: i32,
}

#[derive(Snapshot, Debug, PartialEq)]
enum Phase {
    Idle,
    Running {
        since_ms: u64,
        #[snapshot(skip)]
        cache: Vec<u8>,
    },
    Done(u64, Option<Point>),
    Empty {},
}

#[test]
fn named_struct_round_trips() {
    round_trip(Counter {
        count: 3,
        seen: vec![1, 2, 3],
    });
}

#[test]
fn tuple_struct_round_trips() {
    round_trip(Pair(7, "seven".to_string()));
}

#[test]
fn unit_and_empty_structs_round_trip() {
    round_trip(Marker);
    round_trip(EmptyBraces {});
    round_trip(EmptyParens());
}

#[test]
fn enum_unit_variant_round_trips() {
    round_trip(Phase::Idle);
}

#[test]
fn enum_named_variant_round_trips() {
    round_trip(Phase::Running {
        since_ms: 9,
        cache: Vec::new(),
    });
}

#[test]
fn enum_tuple_variant_round_trips() {
    round_trip(Phase::Done(4, Some(Point { x: -1, y: 2 })));
    round_trip(Phase::Empty {});
}

#[test]
fn enum_skipped_field_restores_as_default() {
    let value = Phase::Running {
        since_ms: 9,
        cache: vec![1, 2],
    };
    let back: Phase = restore_as(&value).unwrap();
    assert_eq!(
        back,
        Phase::Running {
            since_ms: 9,
            cache: Vec::new()
        }
    );
}

#[test]
fn payloads_are_postcard_fields_in_order() {
    let mut payload = Vec::new();
    Pair(300, "ab".to_string())
        .encode_payload(&mut payload)
        .unwrap();
    // 300 as a varint, then the string's length and bytes.
    assert_eq!(payload, [0xac, 0x02, 2, b'a', b'b']);
    let mut payload = Vec::new();
    Phase::Done(1, None).encode_payload(&mut payload).unwrap();
    // Variant index 2, then 1, then `None`.
    assert_eq!(payload, [2, 1, 0]);
}

#[test]
fn shapes_have_expected_canonical_text() {
    assert_eq!(canonical::<Pair>(), "Pair@1(0:u32,1:String)");
    assert_eq!(canonical::<Marker>(), "Marker@1");
    assert_eq!(canonical::<EmptyBraces>(), "EmptyBraces@1{}");
    assert_eq!(
        canonical::<Phase>(),
        "Phase@1[Idle()|Running(since_ms:u64)|Done(0:u64,1:Option<Point>)|Empty()]"
    );
}

// -------------------------------------------------------------- generics

#[derive(Snapshot, Debug, PartialEq)]
struct Window<T> {
    items: Vec<T>,
    limit: usize,
}

#[derive(Snapshot, Debug, PartialEq)]
struct Keyed<K, V>
where
    K: Ord,
{
    map: BTreeMap<K, V>,
    #[snapshot(skip)]
    marker: PhantomData<V>,
}

#[derive(Snapshot, Debug, PartialEq)]
struct Fixed<const N: usize> {
    data: [u64; N],
}

#[derive(Snapshot, Debug, PartialEq)]
enum Either<L, R: Clone> {
    Left(L),
    Right { value: R },
}

#[derive(Snapshot, Debug, PartialEq)]
struct Holder<T> {
    #[snapshot(nested)]
    window: Window<T>,
    #[snapshot(skip)]
    scratch: T,
}

#[test]
fn generic_struct_round_trips_for_several_types() {
    round_trip(Window {
        items: vec!["a".to_string()],
        limit: 2,
    });
    round_trip(Window {
        items: vec![1u8, 2],
        limit: 5,
    });
}

#[test]
fn generic_with_where_clause_round_trips() {
    let map = BTreeMap::from([("k".to_string(), 1u64), ("j".to_string(), 2)]);
    round_trip(Keyed {
        map,
        marker: PhantomData,
    });
}

#[test]
fn const_generic_round_trips() {
    round_trip(Fixed { data: [1, 2, 3, 4] });
}

#[test]
fn generic_enum_round_trips() {
    round_trip(Either::<u8, String>::Left(1));
    round_trip(Either::<u8, String>::Right {
        value: "r".to_string(),
    });
}

#[test]
fn generic_nested_and_skipped_fields_round_trip() {
    let value = Holder {
        window: Window {
            items: vec![5u32],
            limit: 1,
        },
        scratch: 77u32,
    };
    let back: Holder<u32> = restore_as(&value).unwrap();
    assert_eq!(
        back,
        Holder {
            window: Window {
                items: vec![5],
                limit: 1
            },
            scratch: 0
        }
    );
}

#[test]
fn generic_schema_records_types_as_written() {
    assert_eq!(
        canonical::<Window<String>>(),
        "Window@1{items:Vec<T>,limit:usize}"
    );
    assert_eq!(canonical::<Fixed<4>>(), "Fixed@1{data:[u64;N]}");
    assert_eq!(
        canonical::<Holder<u8>>(),
        "Holder@1{window:#[nested]Window<T>}"
    );
}

// ---------------------------------------------------------- skip, default

fn seven() -> u64 {
    7
}

mod defaults {
    pub fn label() -> String {
        "restored".to_string()
    }
}

#[derive(Snapshot, Debug, PartialEq)]
struct WithSkips {
    kept: u64,
    #[snapshot(skip)]
    plain: Vec<u64>,
    #[snapshot(skip, default = seven)]
    local: u64,
    #[snapshot(skip)]
    #[snapshot(default = defaults::label)]
    label: String,
}

#[test]
fn skipped_fields_take_default_or_function_value() {
    let value = WithSkips {
        kept: 1,
        plain: vec![9],
        local: 100,
        label: "live".to_string(),
    };
    let back: WithSkips = restore_as(&value).unwrap();
    let expected = WithSkips {
        kept: 1,
        plain: Vec::new(),
        local: 7,
        label: "restored".to_string(),
    };
    assert_eq!(back, expected);
}

#[test]
fn skipped_fields_are_not_in_the_schema() {
    assert_eq!(canonical::<WithSkips>(), "WithSkips@1{kept:u64}");
}

// ------------------------------------------- field names that could clash

#[derive(Snapshot, Debug, PartialEq)]
#[allow(non_snake_case)]
struct Clashing {
    r#type: u8,
    __snapflow_out: u8,
    input: u8,
    payload: u8,
    Ok: u8,
}

#[test]
fn field_names_do_not_clash_with_generated_names() {
    round_trip(Clashing {
        r#type: 1,
        __snapflow_out: 2,
        input: 3,
        payload: 4,
        Ok: 5,
    });
    assert_eq!(
        canonical::<Clashing>(),
        "Clashing@1{type:u8,__snapflow_out:u8,input:u8,payload:u8,Ok:u8}"
    );
}

// --------------------------------------------------------- crate override

#[derive(sf::Snapshot, Debug, PartialEq)]
#[snapshot(crate = "sf")]
struct Renamed {
    value: u16,
}

#[test]
fn crate_override_round_trips() {
    round_trip(Renamed { value: 12 });
}

// ------------------------------------------------------------ fingerprint

#[test]
fn fingerprint_is_stable_across_builds() {
    assert_eq!(canonical::<Counter>(), "Counter@1{count:u64,seen:Vec<u64>}");
    // FNV-1a of the text above; a change here breaks every stored blob.
    assert_eq!(Counter::fingerprint(), 0xe328_2fe7_8a97_07a2);
}

#[test]
fn fingerprint_ignores_whitespace_in_types() {
    const SPACED: Schema = Schema {
        type_name: "Counter",
        version: 1,
        shape: SchemaShape::Named(&[
            FieldSchema {
                name: "count",
                type_name: " u64 ",
            },
            FieldSchema {
                name: "seen",
                type_name: "Vec < u64 >",
            },
        ]),
    };
    assert_eq!(SPACED.fingerprint(), Counter::fingerprint());
}

#[test]
fn schema_field_list_is_readable() {
    assert_eq!(
        Counter::SCHEMA.field_list(),
        ["count: u64", "seen: Vec<u64>"]
    );
    assert_eq!(
        Keyed::<u8, u8>::SCHEMA.field_list(),
        ["map: BTreeMap<K, V>"]
    );
}

// --------------------------------------------------------- upgrade chains

#[derive(Snapshot, Debug, PartialEq)]
#[snapshot(name = "Meter")]
struct MeterV1 {
    count: u32,
}

#[derive(Snapshot, Debug, PartialEq)]
#[snapshot(name = "Meter", version = 2, upgrade_from = MeterV1)]
struct MeterV2 {
    count: u64,
}

#[derive(Snapshot, Debug, PartialEq)]
#[snapshot(version = 3)]
#[snapshot(upgrade_from = MeterV2)]
struct Meter {
    count: u64,
    unit: String,
}

impl From<MeterV1> for MeterV2 {
    fn from(old: MeterV1) -> Self {
        MeterV2 {
            count: u64::from(old.count) * 10,
        }
    }
}

impl From<MeterV2> for Meter {
    fn from(old: MeterV2) -> Self {
        Meter {
            count: old.count + 1,
            unit: "ms".to_string(),
        }
    }
}

#[test]
fn chain_upgrades_v1_through_v2_to_v3() {
    let back: Meter = restore_as(&MeterV1 { count: 4 }).unwrap();
    assert_eq!(
        back,
        Meter {
            count: 41,
            unit: "ms".to_string()
        }
    );
}

#[test]
fn chain_upgrades_v2_to_v3() {
    let back: Meter = restore_as(&MeterV2 { count: 4 }).unwrap();
    assert_eq!(
        back,
        Meter {
            count: 5,
            unit: "ms".to_string()
        }
    );
}

#[test]
fn chain_reads_current_version_directly() {
    round_trip(Meter {
        count: 2,
        unit: "s".to_string(),
    });
}

#[test]
fn name_override_sets_schema_type_name() {
    assert_eq!(canonical::<MeterV1>(), "Meter@1{count:u32}");
    assert_eq!(MeterV2::SCHEMA.type_name, "Meter");
}

#[test]
fn stored_version_newer_than_chain_is_a_version_mismatch() {
    #[derive(Snapshot, Debug)]
    #[snapshot(name = "Meter", version = 4)]
    struct MeterV4 {
        count: u64,
    }
    let error = restore_as::<MeterV4, Meter>(&MeterV4 { count: 1 }).unwrap_err();
    assert_version_mismatch(&error, "Meter", 4, 3);
}

// ------------------------------------------------------ mismatch handling

/// What an older build of this program declared.
mod old {
    use snapflow::Snapshot;

    #[derive(Snapshot, Debug)]
    pub struct Counter {
        pub count: u64,
    }

    #[derive(Snapshot, Debug)]
    pub struct Gauge {
        pub level: u32,
    }
}

/// What the current build declares under the same names.
mod new {
    use snapflow::Snapshot;

    #[derive(Snapshot, Debug)]
    pub struct Counter {
        pub count: u64,
        pub seen: Vec<u64>,
    }

    #[derive(Snapshot, Debug)]
    #[snapshot(version = 2)]
    pub struct Gauge {
        pub level: u64,
    }
}

fn assert_version_mismatch(error: &StateError, type_name: &str, stored: u32, expected: u32) {
    match error {
        StateError::VersionMismatch {
            type_name: name,
            stored: s,
            expected: e,
        } => {
            assert_eq!((name.as_str(), *s, *e), (type_name, stored, expected));
        }
        other => panic!("expected a version mismatch, got {other:?}"),
    }
    let text = error.to_string();
    assert!(text.contains(&format!("version {stored}")), "{text}");
    assert!(text.contains(&format!("version {expected}")), "{text}");
    assert!(!error.is_retryable());
}

#[test]
fn older_version_without_upgrade_is_a_version_mismatch() {
    let error = restore_as::<old::Gauge, new::Gauge>(&old::Gauge { level: 1 }).unwrap_err();
    assert_version_mismatch(&error, "Gauge", 1, 2);
}

#[test]
fn newer_version_is_a_version_mismatch() {
    let error = restore_as::<new::Gauge, old::Gauge>(&new::Gauge { level: 1 }).unwrap_err();
    assert_version_mismatch(&error, "Gauge", 2, 1);
}

#[test]
fn same_version_different_fields_is_a_schema_mismatch() {
    let error = restore_as::<old::Counter, new::Counter>(&old::Counter { count: 1 }).unwrap_err();
    let StateError::SchemaMismatch(details) = &error else {
        panic!("expected a schema mismatch, got {error:?}");
    };
    assert_eq!(details.stored_fields, ["count: u64"]);
    assert_eq!(details.expected_fields, ["count: u64", "seen: Vec<u64>"]);
    let text = error.to_string();
    assert!(text.contains("stored fields [count: u64]"), "{text}");
    assert!(
        text.contains("expected fields [count: u64, seen: Vec<u64>]"),
        "{text}"
    );
}

#[derive(Snapshot, Debug)]
#[snapshot(name = "Gauge", version = 2)]
struct GaugeV2 {
    level: u64,
}

#[derive(Snapshot, Debug)]
#[snapshot(name = "Gauge", version = 3, upgrade_from = GaugeV2)]
struct GaugeV3 {
    level: u64,
}

impl From<GaugeV2> for GaugeV3 {
    fn from(old: GaugeV2) -> Self {
        GaugeV3 { level: old.level }
    }
}

#[test]
fn version_older_than_chain_names_the_newest_version() {
    let error = restore_as::<old::Gauge, GaugeV3>(&old::Gauge { level: 1 }).unwrap_err();
    assert_version_mismatch(&error, "Gauge", 1, 3);
}

// ------------------------------------------------------------ nested state

/// An older build's inner and outer state: the outer type is unchanged, only
/// the nested type gained a version.
mod nested_old {
    use snapflow::Snapshot;

    #[derive(Snapshot)]
    pub struct Inner {
        pub total: u32,
    }

    #[derive(Snapshot)]
    pub struct Outer {
        pub id: u8,
        #[snapshot(nested)]
        pub inner: Inner,
    }
}

#[derive(Snapshot, Debug, PartialEq)]
#[snapshot(version = 2, upgrade_from = nested_old::Inner)]
struct Inner {
    total: u64,
}

impl From<nested_old::Inner> for Inner {
    fn from(old: nested_old::Inner) -> Self {
        Inner {
            total: u64::from(old.total) + 1000,
        }
    }
}

#[derive(Snapshot, Debug, PartialEq)]
struct Outer {
    id: u8,
    #[snapshot(nested)]
    inner: Inner,
}

#[test]
fn nested_field_round_trips() {
    round_trip(Outer {
        id: 1,
        inner: Inner { total: 5 },
    });
}

#[test]
fn nested_field_follows_its_own_upgrade_chain() {
    let stored = nested_old::Outer {
        id: 3,
        inner: nested_old::Inner { total: 5 },
    };
    let back: Outer = restore_as(&stored).unwrap();
    assert_eq!(
        back,
        Outer {
            id: 3,
            inner: Inner { total: 1005 }
        }
    );
}

#[test]
fn nested_and_serde_fields_have_different_schemas() {
    assert_eq!(canonical::<Outer>(), "Outer@1{id:u8,inner:#[nested]Inner}");
}

// ------------------------------------------------------------ bad payloads

fn check_payload_error<T: Snapshot + Debug>(payload: &[u8], reason: &str) {
    match T::decode_payload(payload) {
        Err(StateError::Payload {
            type_name,
            reason: actual,
        }) => {
            assert_eq!(type_name, T::SCHEMA.type_name);
            assert!(actual.contains(reason), "{actual}");
        }
        other => panic!("expected a payload error containing {reason:?}, got {other:?}"),
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    check_payload_error::<Pair>(&[1, 0, 9], "1 trailing bytes");
    check_payload_error::<Marker>(&[0], "1 trailing bytes");
}

#[test]
fn unknown_variant_is_rejected() {
    check_payload_error::<Phase>(&[9], "unknown variant index 9");
}

#[test]
fn truncated_payload_is_rejected() {
    // `seen` claims three elements but holds one.
    check_payload_error::<Counter>(&[1, 3, 1], "end of buffer");
    check_payload_error::<Outer>(
        &[1, 100, 0],
        "nested blob claims 100 bytes but only 1 remain",
    );
}
