//! A probe of what the test broker does with transactions: one
//! transaction committed, one aborted, then the topic read at both
//! isolation levels. It asserts what the broker in `.ci/kafka.sh` did when
//! the connector was written (see docs/design/kafka-connector.md), so
//! that a broker upgrade that changes it fails here, by name, before the
//! connector's own tests fail in confusing ways.

#[path = "kafka/support.rs"]
mod kafka_support;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use kafka_support::{broker, create_topic, read_all, unique, TIMEOUT};

/// Sends one record to partition 0 of `topic` (into the open
/// transaction, if any).
fn send_one(producer: &BaseProducer, topic: &str, value: &str) {
    producer
        .send(BaseRecord::<(), _>::to(topic).partition(0).payload(value))
        .map_err(|(error, _)| error)
        .expect("send");
}

/// A transactional producer with the id `id`.
fn transactional(brokers: &str, id: &str) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", id)
        .create()
        .expect("a transactional producer")
}

/// The metadata `send_offsets_to_transaction` needs for `group`, from a
/// consumer that never joins it.
fn group_metadata(brokers: &str, group: &str) -> rdkafka::consumer::ConsumerGroupMetadata {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .expect("a consumer for the group metadata");
    consumer.group_metadata().expect("group metadata")
}

fn values(reads: &[kafka_support::Read]) -> Vec<String> {
    reads
        .iter()
        .map(|read| String::from_utf8_lossy(&read.value).into_owned())
        .collect()
}

#[test]
fn committed_and_aborted_transactions_as_each_isolation_level_reads_them() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe");
    create_topic(&brokers, &topic, 1);
    let producer = transactional(&brokers, &unique("probe-txn"));
    producer
        .init_transactions(TIMEOUT)
        .expect("init_transactions");
    for (value, commit) in [
        ("committed-1", true),
        ("aborted-1", false),
        ("committed-2", true),
    ] {
        producer.begin_transaction().expect("begin_transaction");
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(value))
            .map_err(|(error, _)| error)
            .expect("send");
        producer.flush(TIMEOUT).expect("flush");
        if commit {
            producer
                .commit_transaction(TIMEOUT)
                .expect("commit_transaction");
        } else {
            producer
                .abort_transaction(TIMEOUT)
                .expect("abort_transaction");
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let uncommitted = values(&read_all(&brokers, &topic, "read_uncommitted"));
    let committed = values(&read_all(&brokers, &topic, "read_committed"));
    eprintln!("read_uncommitted: {uncommitted:?}");
    eprintln!("read_committed:   {committed:?}");
    assert_eq!(uncommitted, ["committed-1", "aborted-1", "committed-2"]);
    assert_eq!(committed, ["committed-1", "aborted-1", "committed-2"]);
}

/// The offsets the broker reports for a partition after 40 records written
/// in one batch: the records get offsets 0 to 39, but tansu 0.6 answers
/// the "latest offset" request with 1, where Kafka answers 40. Its source
/// (`tansu-storage`, `dynostore.rs`, `list_offsets`) shows why: "latest"
/// is the base offset plus one of the batch object stored *last in time*,
/// and "earliest" the base offset of the one stored *first in time*; a
/// tie keeps the lower offset. So with one writer "latest" is right only
/// when the last batch is stored strictly after the others, and with
/// concurrent writers (the sink's subtasks) neither answer need be: a
/// reader from "earliest" once missed a partition's first 32 records, and
/// on S3 storage a bounded source's end fell 3 records short. The bounded
/// source stops at "latest", so the tests write the last record of each
/// input partition in a batch of its own, after the others are
/// acknowledged (`support::produce`); readers and the source's
/// `StartFrom::Earliest` start at offset 0.
#[test]
fn the_high_watermark_counts_every_record() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-watermark");
    create_topic(&brokers, &topic, 1);
    let records: Vec<_> = (0..40u32)
        .map(|i| (0, Vec::new(), i.to_string().into_bytes()))
        .collect();
    kafka_support::produce_batched(&brokers, &topic, &records);
    let consumer = kafka_support::consumer(&brokers, "read_committed");
    use rdkafka::consumer::Consumer;
    let (low, high) = consumer
        .fetch_watermarks(&topic, 0, TIMEOUT)
        .expect("watermarks");
    eprintln!("watermarks after 40 records: low {low}, high {high}");
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .expect("list");
    consumer.assign(&list).expect("assign");
    let mut offsets = Vec::new();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
            use rdkafka::message::Message;
            offsets.push(message.offset());
        }
    }
    eprintln!("offsets read: {offsets:?}");
    assert_eq!(offsets, (0..40).collect::<Vec<i64>>());
    assert_eq!(
        (low, high),
        (0, 1),
        "the broker's latest offset changed: if it is now 40, tansu fixed its high watermark; \
         update this probe, docs/design/kafka-connector.md and support::produce"
    );
}

/// What one transaction costs on this broker (printed, not asserted: speed
/// goals belong in benchmarks): creating a transactional producer and
/// `init_transactions`, one record, commit, and dropping the producer.
#[test]
fn the_cost_of_one_transaction() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-cost");
    create_topic(&brokers, &topic, 1);
    for round in 0..3 {
        let started = std::time::Instant::now();
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("transactional.id", unique("probe-cost-txn"))
            .set("retry.backoff.ms", "5")
            .create()
            .expect("a transactional producer");
        producer
            .init_transactions(TIMEOUT)
            .expect("init_transactions");
        let init_ms = started.elapsed().as_millis();
        producer.begin_transaction().expect("begin");
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload("x"))
            .map_err(|(error, _)| error)
            .expect("send");
        producer.flush(TIMEOUT).expect("flush");
        let flush_ms = started.elapsed().as_millis() - init_ms;
        producer.commit_transaction(TIMEOUT).expect("commit");
        let commit_ms = started.elapsed().as_millis() - init_ms - flush_ms;
        drop(producer);
        let drop_ms = started.elapsed().as_millis() - init_ms - flush_ms - commit_ms;
        eprintln!("round {round}: init {init_ms} ms, flush {flush_ms} ms, commit {commit_ms} ms, drop {drop_ms} ms");
    }
}

/// Fencing: a second producer with the same transactional id initialises
/// while the first has a transaction open with a record flushed. On Kafka
/// the open transaction is aborted and the first producer is fenced (its
/// commit fails). The sink's restore relies on the first half (it fences
/// ids a dead incarnation may have left open); this records what tansu
/// does with both halves. What it showed with tansu 0.6: the first
/// producer's commit does not succeed (librdkafka times out waiting for
/// it), and the flushed record stays readable (aborted records are never
/// hidden there).
#[test]
fn a_second_producer_with_the_same_id_fences_the_first() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-fence");
    create_topic(&brokers, &topic, 1);
    let id = unique("probe-fence-txn");
    let make = || transactional(&brokers, &id);
    let first = make();
    first.init_transactions(TIMEOUT).expect("init_transactions");
    first.begin_transaction().expect("begin");
    send_one(&first, &topic, "lingering");
    first.flush(TIMEOUT).expect("flush");
    let second = make();
    second
        .init_transactions(TIMEOUT)
        .expect("the second producer initialises");
    let fenced = first.commit_transaction(Duration::from_secs(2));
    eprintln!("the first producer's commit after the second initialised: {fenced:?}");
    assert!(
        fenced.is_err(),
        "the broker let a fenced producer commit: the sink's fencing on restore does not hold"
    );
    second.begin_transaction().expect("begin");
    send_one(&second, &topic, "after");
    second
        .commit_transaction(TIMEOUT)
        .expect("the second commits");
    let values = values(&read_all(&brokers, &topic, "read_committed"));
    eprintln!("read_committed after fencing: {values:?}");
    // tansu shows the aborted record too (see the first probe).
    assert_eq!(values, ["lingering", "after"]);
}

/// The committed offset of `group` for partition 0 of `topic` with its
/// metadata, or `None` when the group has none.
fn group_offset(brokers: &str, group: &str, topic: &str) -> Option<(i64, String)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition(topic, 0);
    let committed = consumer
        .committed_offsets(list, TIMEOUT)
        .expect("committed offsets");
    let element = &committed.elements()[0];
    match element.offset() {
        rdkafka::Offset::Offset(offset) => Some((offset, element.metadata().to_owned())),
        _ => None,
    }
}

/// Offsets sent to a transaction (`send_offsets_to_transaction`, Kafka's
/// `TxnOffsetCommit`): the exactly-once sink records its checkpoint id
/// this way, as the committed offset of a group of its own, so that a
/// restore in a new process can tell whether a transaction the dead
/// process pre-committed was committed (the group's offset reached it) or
/// not (then the sink writes its records again). That needs the broker to
/// apply the offset when, and only when, the transaction commits: not
/// when it is sent, not when the transaction aborts, not when a second
/// producer with the same id fences it. This asserts exactly that, and
/// that the broker drops the offsets' metadata string.
#[test]
fn offsets_sent_to_a_transaction_count_only_when_it_commits() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-offsets");
    create_topic(&brokers, &topic, 1);
    let group = unique("probe-offsets-group");
    let id = unique("probe-offsets-txn");
    let make = || transactional(&brokers, &id);
    let metadata = group_metadata(&brokers, &group);
    let offsets = |offset: i64| {
        let mut list = rdkafka::TopicPartitionList::new();
        list.add_partition_offset(&topic, 0, rdkafka::Offset::Offset(offset))
            .expect("an offset list");
        if let Some(mut element) = list.find_partition(&topic, 0) {
            element.set_metadata(format!("marker {offset}"));
        }
        list
    };
    let producer = make();
    producer.init_transactions(TIMEOUT).expect("init");
    // Committed: the offset counts.
    producer.begin_transaction().expect("begin");
    send_one(&producer, &topic, "one");
    producer
        .send_offsets_to_transaction(&offsets(5), &metadata, TIMEOUT)
        .expect("send_offsets_to_transaction");
    let before_commit = group_offset(&brokers, &group, &topic);
    producer.commit_transaction(TIMEOUT).expect("commit");
    let after_commit = group_offset(&brokers, &group, &topic);
    // Aborted: it does not.
    producer.begin_transaction().expect("begin");
    send_one(&producer, &topic, "two");
    producer
        .send_offsets_to_transaction(&offsets(9), &metadata, TIMEOUT)
        .expect("send_offsets_to_transaction");
    producer.flush(TIMEOUT).expect("flush");
    let while_open = group_offset(&brokers, &group, &topic);
    producer.abort_transaction(TIMEOUT).expect("abort");
    let after_abort = group_offset(&brokers, &group, &topic);
    // Left open by a producer that vanished, then fenced by a new one.
    producer.begin_transaction().expect("begin");
    send_one(&producer, &topic, "three");
    producer
        .send_offsets_to_transaction(&offsets(11), &metadata, TIMEOUT)
        .expect("send_offsets_to_transaction");
    producer.flush(TIMEOUT).expect("flush");
    std::mem::forget(producer);
    let fencer = make();
    fencer
        .init_transactions(TIMEOUT)
        .expect("the fencer initialises");
    let after_fence = group_offset(&brokers, &group, &topic);
    // A producer with another transactional id (the sink opens one per
    // checkpoint) commits offsets for the same group.
    let other = transactional(&brokers, &unique("probe-offsets-other"));
    other.init_transactions(TIMEOUT).expect("init");
    other.begin_transaction().expect("begin");
    send_one(&other, &topic, "four");
    other
        .send_offsets_to_transaction(&offsets(13), &metadata, TIMEOUT)
        .expect("send_offsets_to_transaction");
    other.commit_transaction(TIMEOUT).expect("commit");
    let other_id = group_offset(&brokers, &group, &topic);
    eprintln!("after a commit under another id: {other_id:?}");
    assert_eq!(
        other_id,
        Some((13, String::new())),
        "a commit under another id moves the offset"
    );
    // tansu 0.6 drops the metadata string of offsets sent to a
    // transaction, so the marker keeps everything in offsets (see
    // `marker.rs`); a broker that keeps it fails here, harmlessly.
    let five = Some((5, String::new()));
    let seen = [
        before_commit,
        after_commit,
        while_open,
        after_abort,
        after_fence,
    ];
    eprintln!("group offset before commit, after commit, open, after abort, after fence: {seen:?}");
    assert_eq!(
        seen,
        [None, five.clone(), five.clone(), five.clone(), five],
        "the broker applies transactional offsets differently: the Kafka sink's restore \
         (sink/recover.rs) reads them to know what a dead process committed"
    );
}

/// A transaction whose `commit_transaction` returned, in a process
/// killed (SIGKILL) the moment after, as a sink subtask is when its
/// process dies right after a checkpoint's commit; with `next_pending`,
/// the process had also opened the next transaction under the next id
/// and sent it the next offset (the sink's next pre-commit). The
/// exactly-once sink's restore in the next process reads the commit
/// marker (the group's offset) to learn what was committed; this asks
/// the broker for it at once, after a new producer with the committed
/// transaction's id initialised (fencing it, as the restore does), and a
/// second later, over several trials. Returns what it saw.
fn offsets_after_a_kill(
    brokers: &str,
    next_pending: bool,
) -> Vec<(Option<i64>, Option<i64>, Option<i64>)> {
    use snapflow_tests::crash::{kill, spawn, wait_for_line};
    use std::process::Command;
    const TRIALS: usize = 6;
    let mut seen = Vec::new();
    for _ in 0..TRIALS {
        let topic = unique("probe-killed");
        create_topic(brokers, &topic, 1);
        let group = unique("probe-killed-group");
        let id = unique("probe-killed-txn");
        let mut command = Command::new(env!("CARGO_BIN_EXE_kafka_commit_child"));
        command.args([brokers, &topic, &group, &id]).arg("2");
        if next_pending {
            command.arg(format!("{id}-next"));
        }
        let mut child = spawn(&mut command);
        let last = if next_pending {
            "pending"
        } else {
            "committed 2"
        };
        let line = wait_for_line(&mut child, last);
        kill(child);
        assert!(line.is_some(), "the child did not reach `{last}`");
        let offset = || group_offset(brokers, &group, &topic).map(|(offset, _)| offset);
        let at_once = offset();
        let fencer = transactional(brokers, &id);
        fencer
            .init_transactions(TIMEOUT)
            .expect("the fencer initialises");
        let after_fence = offset();
        std::thread::sleep(Duration::from_secs(1));
        seen.push((at_once, after_fence, offset()));
    }
    seen
}

#[test]
fn a_commit_acknowledged_before_its_process_is_killed_is_kept() {
    let Some(brokers) = broker() else { return };
    let seen = offsets_after_a_kill(&brokers, false);
    eprintln!(
        "the group's offset after the kill: at once, after a fence, a second later: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|trial| *trial == (Some(2), Some(2), Some(2))),
        "a commit acknowledged before its process died is not (yet) visible: {seen:?}"
    );
}

#[test]
fn a_commit_acknowledged_before_its_process_is_killed_with_the_next_open() {
    let Some(brokers) = broker() else { return };
    let seen = offsets_after_a_kill(&brokers, true);
    eprintln!(
        "the group's offset after the kill, the next transaction open: at once, after a fence, \
         a second later: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|trial| *trial == (Some(2), Some(2), Some(2))),
        "a commit acknowledged before its process died is not (yet) visible while the next \
         transaction is open: {seen:?}"
    );
}

/// The commit marker packs a checkpoint id into the high bits of an
/// offset (`marker.rs`: `checkpoint << 31 | span << 23 | nonce`), so the
/// broker must keep a transactional offset past 2^31 whole. This commits
/// such offsets, one transaction each, and reads each back at once.
#[test]
fn transactional_offsets_past_two_to_the_31_are_kept_whole() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-wide");
    create_topic(&brokers, &topic, 1);
    let group = unique("probe-wide-group");
    let producer = transactional(&brokers, &unique("probe-wide-txn"));
    producer.init_transactions(TIMEOUT).expect("init");
    let metadata = group_metadata(&brokers, &group);
    let mut seen = Vec::new();
    for offset in [
        5_i64,
        (1 << 31) | 5,
        (2 << 31) | 5,
        (3 << 31) | 5,
        (40 << 31) | 5,
    ] {
        producer.begin_transaction().expect("begin");
        send_one(&producer, &topic, "one");
        let mut list = rdkafka::TopicPartitionList::new();
        list.add_partition_offset(&topic, 0, rdkafka::Offset::Offset(offset))
            .expect("an offset list");
        producer
            .send_offsets_to_transaction(&list, &metadata, TIMEOUT)
            .expect("send_offsets_to_transaction");
        producer.commit_transaction(TIMEOUT).expect("commit");
        seen.push((
            offset,
            group_offset(&brokers, &group, &topic).map(|(o, _)| o),
        ));
    }
    eprintln!("committed offset and read back: {seen:?}");
    assert!(
        seen.iter().all(|(offset, read)| *read == Some(*offset)),
        "the broker does not keep wide offsets: {seen:?}"
    );
}

/// What the exactly-once sink's send gate and its restore's fences
/// (`connectors/kafka/gate.rs`, `unblock.rs`) are for. Transaction A (one
/// id) holds a record in a partition, still open; transaction B (another
/// id) then writes a record to the same partition with offsets for a
/// group, and commits. Kafka applies B's offsets when B commits. tansu
/// 0.6 decides B's commit but applies its offsets only when A ends too
/// (here by an abort), as part of A's `EndTxn`; a third transaction's
/// end then changes nothing. So a process that dies with A open leaves
/// B's commit marker unapplied until someone ends A. A broker that
/// changes this fails here: then the gate and the fences may be
/// needless, or not enough.
#[test]
fn offsets_of_a_commit_behind_an_open_transaction_wait_for_a_later_end() {
    let Some(brokers) = broker() else { return };
    let topic = unique("probe-overlap");
    create_topic(&brokers, &topic, 1);
    let group = unique("probe-overlap-group");
    let metadata = group_metadata(&brokers, &group);
    let mut offsets = rdkafka::TopicPartitionList::new();
    offsets
        .add_partition_offset(&topic, 0, rdkafka::Offset::Offset(7))
        .expect("an offset list");
    let open = |name: &str| {
        let producer = transactional(&brokers, &unique(name));
        producer.init_transactions(TIMEOUT).expect("init");
        producer.begin_transaction().expect("begin");
        send_one(&producer, &topic, name);
        producer.flush(TIMEOUT).expect("flush");
        producer
    };
    let a = open("probe-overlap-a");
    let b = open("probe-overlap-b");
    b.send_offsets_to_transaction(&offsets, &metadata, TIMEOUT)
        .expect("send_offsets_to_transaction");
    b.commit_transaction(TIMEOUT).expect("B commits");
    let after_b = group_offset(&brokers, &group, &topic);
    a.abort_transaction(TIMEOUT).expect("A aborts");
    let after_a = group_offset(&brokers, &group, &topic);
    let c = open("probe-overlap-c");
    c.abort_transaction(TIMEOUT).expect("C aborts");
    let after_c = group_offset(&brokers, &group, &topic);
    let seen = [after_b, after_a, after_c];
    eprintln!("group offset after B's commit, A's abort, C's abort: {seen:?}");
    let seven = Some((7, String::new()));
    assert_eq!(
        seen,
        [None, seven.clone(), seven],
        "the broker applies the offsets of a commit behind an open transaction differently \
         (see connectors/kafka/unblock.rs)"
    );
}
