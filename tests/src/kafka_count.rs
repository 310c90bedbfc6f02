//! The record codec every Kafka keyed-count test shares: the input value
//! is a decimal id, the output `(key, count)` is the value `key:count`
//! keyed by the key. It owns nothing else: topics, brokers and checks stay
//! with each test.

use snapflow::connectors::kafka::{KafkaOut, KafkaRecord};

/// Decodes an input record; anything that is not a decimal number is
/// rejected.
pub fn decode_id(record: &KafkaRecord<'_>) -> Result<u64, String> {
    let value = record.value().ok_or("no value")?;
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("not a number: {value:?}"))
}

/// The output record of `(key, count)`.
pub fn encode_count(&(key, count): &(u64, u64)) -> KafkaOut {
    KafkaOut {
        key: Some(key.to_string().into_bytes()),
        value: format!("{key}:{count}").into_bytes(),
        partition: None,
        timestamp_ms: None,
    }
}
