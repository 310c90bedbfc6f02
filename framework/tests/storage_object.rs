//! The checkpoint store's guarantees on object storage, checked against
//! the file store in the same test: each `check_*` runs on a directory,
//! on an in-memory object store (always) and on a real S3 server (moto
//! from `.ci/s3.sh`, when `SNAPFLOW_S3_ENDPOINT` is set; skipped with a
//! message outside CI, a failure in CI). Then what only object storage
//! has: two writers on one location (the one taken over cannot commit or
//! delete), and the typed errors of a missing bucket, refused or missing
//! credentials and an unreachable endpoint.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use snapflow::storage::{
    names, CheckpointKind, CheckpointStore, CommitRequest, FsCheckpointStore, Leftover,
    ObjectCheckpointStore, ObjectStoreProblem, PartId, S3Settings, Segment, SharedRange,
    StoreError, StoreOptions,
};

const JOB: &str = "object-suite";
const S3_ENDPOINT_VAR: &str = "SNAPFLOW_S3_ENDPOINT";

/// Where a store under test keeps its checkpoints, and a way to reach
/// its bytes behind its back.
enum Backend {
    Fs(tempfile::TempDir),
    Object {
        raw: Arc<dyn ObjectStore>,
        location: String,
        prefix: String,
        /// Set for S3: the store is opened through its settings, as a
        /// user would.
        settings: Option<Box<S3Settings>>,
        runtime: Arc<tokio::runtime::Runtime>,
    },
}

fn runtime() -> Arc<tokio::runtime::Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
    )
}

fn unique(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{what}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// The S3 endpoint, or `None` (skipping) outside CI; CI must run these.
fn s3_endpoint() -> Option<String> {
    if let Some(value) = std::env::var(S3_ENDPOINT_VAR)
        .ok()
        .filter(|value| !value.is_empty())
    {
        return Some(value);
    }
    let ci = std::env::var("CI").is_ok_and(|value| value == "true");
    assert!(
        !ci,
        "{S3_ENDPOINT_VAR} is not set, and CI must not skip the S3 tests"
    );
    eprintln!(
        "skipped the S3 half: {S3_ENDPOINT_VAR} is not set; start one with \
         `eval \"$(.ci/s3.sh start)\"`"
    );
    None
}

fn settings(endpoint: &str) -> S3Settings {
    S3Settings {
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".to_string()),
        access_key_id: Some("snapflow".to_string()),
        secret_access_key: Some("snapflow".to_string()),
        ..S3Settings::default()
    }
}

/// Creates `bucket` on the S3 server at `endpoint` (moto checks no
/// signature, but wants one).
fn create_bucket(endpoint: &str, bucket: &str) {
    let address = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nAuthorization: AWS4-HMAC-SHA256 \
         Credential=snapflow/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, \
         Signature=0\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A fresh bucket on the S3 server, as a backend; `None` when skipped.
fn s3_backend() -> Option<Backend> {
    let endpoint = s3_endpoint()?;
    let bucket = unique("chk");
    create_bucket(&endpoint, &bucket);
    let raw = AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_bucket_name(&bucket)
        .with_access_key_id("snapflow")
        .with_secret_access_key("snapflow")
        .build()
        .unwrap();
    Some(Backend::Object {
        raw: Arc::new(raw),
        location: format!("s3://{bucket}/team/jobs"),
        prefix: "team/jobs".to_string(),
        settings: Some(Box::new(settings(&endpoint))),
        runtime: runtime(),
    })
}

fn memory_backend() -> Backend {
    Backend::Object {
        raw: Arc::new(InMemory::new()),
        location: "memory://suite/jobs".to_string(),
        prefix: "jobs".to_string(),
        settings: None,
        runtime: runtime(),
    }
}

/// Every backend this run can reach: a directory, memory and S3.
fn backends() -> Vec<Backend> {
    let mut all = vec![Backend::Fs(tempfile::tempdir().unwrap()), memory_backend()];
    all.extend(s3_backend());
    all
}

impl Backend {
    fn name(&self) -> &str {
        match self {
            Backend::Fs(_) => "file store",
            Backend::Object { settings: None, .. } => "in-memory object store",
            Backend::Object { .. } => "S3",
        }
    }

    fn open(&self, retained_checkpoints: usize) -> Box<dyn CheckpointStore> {
        let options = StoreOptions {
            retained_checkpoints,
        };
        match self {
            Backend::Fs(dir) => {
                Box::new(FsCheckpointStore::open_with(dir.path(), JOB, options).unwrap())
            }
            Backend::Object { .. } => Box::new(self.open_object(options).unwrap()),
        }
    }

    fn open_object(&self, options: StoreOptions) -> Result<ObjectCheckpointStore, StoreError> {
        let Backend::Object {
            raw,
            location,
            prefix,
            settings,
            ..
        } = self
        else {
            panic!("not an object backend");
        };
        match settings {
            Some(settings) => ObjectCheckpointStore::open_s3(location, JOB, options, settings),
            None => ObjectCheckpointStore::with_object_store(
                Arc::clone(raw),
                location,
                ObjectPath::from(prefix.as_str()),
                JOB,
                options,
            ),
        }
    }

    fn job_key(&self, relative: &str) -> ObjectPath {
        let Backend::Object { prefix, .. } = self else {
            panic!("not an object backend");
        };
        let job = names::job_dir_name(JOB).unwrap();
        ObjectPath::from(format!("{prefix}/{job}/{relative}"))
    }

    /// Overwrites the file or object `relative` to the job's directory.
    fn put(&self, relative: &str, bytes: &[u8]) {
        match self {
            Backend::Fs(dir) => {
                let job = names::job_dir_name(JOB).unwrap();
                std::fs::write(dir.path().join(job).join(relative), bytes).unwrap();
            }
            Backend::Object { raw, runtime, .. } => {
                let key = self.job_key(relative);
                let payload = PutPayload::from(bytes.to_vec());
                runtime.block_on(raw.put(&key, payload)).unwrap();
            }
        }
    }

    /// Every file under `relative`, as paths relative to it, sorted.
    fn files(&self, relative: &str) -> Vec<String> {
        let mut found = match self {
            Backend::Fs(dir) => {
                let job = names::job_dir_name(JOB).unwrap();
                walk(&dir.path().join(job).join(relative))
            }
            Backend::Object { raw, runtime, .. } => {
                use futures::TryStreamExt;
                let key = self.job_key(relative);
                let listed: Vec<_> = runtime
                    .block_on(raw.list(Some(&key)).try_collect::<Vec<_>>())
                    .unwrap();
                let skip = key.as_ref().len() + 1;
                listed
                    .into_iter()
                    .map(|meta| meta.location.as_ref()[skip..].to_string())
                    .collect()
            }
        };
        found.sort();
        found
    }
}

fn walk(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if entry.file_type().unwrap().is_dir() {
            found.extend(
                walk(&entry.path())
                    .into_iter()
                    .map(|inner| format!("{name}/{inner}")),
            );
        } else {
            found.push(name);
        }
    }
    found
}

// ----- the suite, on every backend -----

fn parts() -> Vec<PartId> {
    vec![
        PartId::new("source", 0),
        PartId::new("counter", 0),
        PartId::new("counter", 1),
    ]
}

fn part_bytes(checkpoint: u64, part: &PartId) -> Vec<u8> {
    format!("checkpoint {checkpoint} of {part};")
        .repeat(50)
        .into_bytes()
}

fn commit(store: &dyn CheckpointStore, checkpoint: u64, kind: CheckpointKind) {
    store.begin(checkpoint, kind).unwrap();
    for part in parts() {
        store
            .write_part(checkpoint, &part, &part_bytes(checkpoint, &part))
            .unwrap();
    }
    store.commit(checkpoint, CommitRequest::default()).unwrap();
}

fn listed(store: &dyn CheckpointStore) -> Vec<u64> {
    store
        .list()
        .unwrap()
        .iter()
        .map(|entry| entry.checkpoint)
        .collect()
}

fn part_file(checkpoint: u64, part: &PartId) -> String {
    format!(
        "checkpoints/chk-{checkpoint:020}/{}/{}.part",
        names::operator_dir_name(&part.operator).unwrap(),
        part.subtask
    )
}

fn check_round_trip_retention_and_savepoints(backend: &Backend) {
    let store = backend.open(2);
    assert_eq!(
        store
            .load_latest()
            .unwrap()
            .checkpoint
            .map(|c| c.metadata.checkpoint),
        None
    );
    for checkpoint in 1..=4 {
        commit(store.as_ref(), checkpoint, CheckpointKind::Checkpoint);
    }
    commit(store.as_ref(), 5, CheckpointKind::Savepoint);
    commit(store.as_ref(), 6, CheckpointKind::Checkpoint);
    // Retention keeps the newest two checkpoints and every savepoint.
    assert_eq!(listed(store.as_ref()), vec![4, 5, 6], "{}", backend.name());
    let loaded = store.load_latest().unwrap().checkpoint.unwrap();
    assert_eq!(loaded.metadata.checkpoint, 6);
    for part in parts() {
        assert_eq!(loaded.parts[&part], part_bytes(6, &part));
    }
    drop(loaded);
    // A store opened again sees the same.
    drop(store);
    let store = backend.open(2);
    assert_eq!(listed(store.as_ref()), vec![4, 5, 6], "{}", backend.name());
    assert_eq!(
        store.load(5).unwrap().metadata.kind,
        CheckpointKind::Savepoint
    );
    assert!(matches!(store.load(2), Err(StoreError::NotFound(2))));
    assert!(store.location().is_some());
}

fn check_damaged_part_falls_back_and_is_set_aside(backend: &Backend) {
    let store = backend.open(3);
    commit(store.as_ref(), 1, CheckpointKind::Checkpoint);
    commit(store.as_ref(), 2, CheckpointKind::Checkpoint);
    backend.put(&part_file(2, &PartId::new("counter", 1)), b"rotten bytes");
    let report = store.load_latest().unwrap();
    assert_eq!(
        report.checkpoint.unwrap().metadata.checkpoint,
        1,
        "{}",
        backend.name()
    );
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].checkpoint, 2);
    assert!(matches!(
        report.skipped[0].reason,
        StoreError::CorruptPart { .. }
    ));
    let moved = store.set_aside(2, "a part failed its checksum").unwrap();
    assert!(moved.is_some(), "{}", backend.name());
    assert_eq!(store.set_aside(9, "no such checkpoint").unwrap(), None);
    assert_eq!(listed(store.as_ref()), vec![1]);
    assert_eq!(store.damaged_ids().unwrap(), vec![2]);
    assert_eq!(store.highest_id().unwrap(), Some(2));
    // The next checkpoint commits above it, and loads.
    commit(store.as_ref(), 3, CheckpointKind::Checkpoint);
    assert_eq!(
        store
            .load_latest()
            .unwrap()
            .checkpoint
            .unwrap()
            .metadata
            .checkpoint,
        3
    );
}

fn check_uncommitted_is_invisible_and_cleaned(backend: &Backend) {
    let store = backend.open(3);
    commit(store.as_ref(), 1, CheckpointKind::Checkpoint);
    store.begin(2, CheckpointKind::Checkpoint).unwrap();
    store
        .write_part(2, &PartId::new("source", 0), b"never committed")
        .unwrap();
    // A crash: the store goes away without committing or discarding.
    drop(store);
    let store = backend.open(3);
    assert_eq!(listed(store.as_ref()), vec![1], "{}", backend.name());
    assert_eq!(store.highest_id().unwrap(), Some(2));
    assert!(store.load_latest().unwrap().skipped.is_empty());
    commit(store.as_ref(), 3, CheckpointKind::Checkpoint);
    // Retention removed the leftover older than a complete checkpoint.
    assert!(
        backend
            .files("checkpoints/chk-00000000000000000002")
            .is_empty(),
        "{}",
        backend.name()
    );
    // A discarded checkpoint leaves nothing.
    store.begin(4, CheckpointKind::Checkpoint).unwrap();
    store
        .write_part(4, &PartId::new("source", 0), b"aborted")
        .unwrap();
    store.discard(4).unwrap();
    assert!(backend
        .files("checkpoints/chk-00000000000000000004")
        .is_empty());
    assert!(matches!(
        store.discard(3),
        Err(StoreError::AlreadyCommitted(3))
    ));
}

fn check_pins_hold_back_retention(backend: &Backend) {
    let store = backend.open(1);
    commit(store.as_ref(), 1, CheckpointKind::Checkpoint);
    let pin = store.pin(1).unwrap();
    commit(store.as_ref(), 2, CheckpointKind::Checkpoint);
    assert_eq!(listed(store.as_ref()), vec![1, 2], "{}", backend.name());
    drop(pin);
    commit(store.as_ref(), 3, CheckpointKind::Checkpoint);
    assert_eq!(listed(store.as_ref()), vec![3], "{}", backend.name());
}

fn body(checkpoint: u64) -> Vec<u8> {
    format!("key group state of {checkpoint};")
        .repeat(40)
        .into_bytes()
}

fn commit_incremental(
    store: &dyn CheckpointStore,
    checkpoint: u64,
    kind: CheckpointKind,
    reused: &[u64],
) -> Vec<u8> {
    store.begin(checkpoint, kind).unwrap();
    let part = PartId::new("Count", 0);
    let mut segments = vec![
        Segment::Own(format!("header {checkpoint}").into_bytes()),
        Segment::Shared(body(checkpoint)),
    ];
    let mut expected = format!("header {checkpoint}").into_bytes();
    expected.extend(body(checkpoint));
    for &earlier in reused {
        let bytes = body(earlier);
        segments.push(Segment::Reuse(SharedRange {
            checkpoint: earlier,
            offset: 0,
            len: bytes.len() as u64,
            crc32: crc32fast::hash(&bytes),
        }));
        expected.extend(bytes);
    }
    store
        .write_part_segments(checkpoint, &part, &segments)
        .unwrap();
    store.commit(checkpoint, CommitRequest::default()).unwrap();
    expected
}

fn shared_ids(backend: &Backend) -> Vec<String> {
    backend.files(&format!(
        "shared/{}",
        names::operator_dir_name("Count").unwrap()
    ))
}

fn check_incremental_shared_objects(backend: &Backend) {
    let store = backend.open(2);
    assert!(store.supports_segments());
    commit_incremental(store.as_ref(), 1, CheckpointKind::Checkpoint, &[]);
    commit_incremental(store.as_ref(), 2, CheckpointKind::Checkpoint, &[1]);
    let expected = commit_incremental(store.as_ref(), 3, CheckpointKind::Checkpoint, &[1, 2]);
    let loaded = store.load_latest().unwrap().checkpoint.unwrap();
    assert_eq!(
        loaded.parts[&PartId::new("Count", 0)],
        expected,
        "{}",
        backend.name()
    );
    drop(loaded);
    // Checkpoint 1 left retention, but 3 still refers to its shared file.
    assert_eq!(listed(store.as_ref()), vec![2, 3]);
    assert_eq!(
        shared_ids(backend).len(),
        3,
        "{}: {:?}",
        backend.name(),
        shared_ids(backend)
    );
    // A savepoint is written self-contained.
    let expected = commit_incremental(store.as_ref(), 4, CheckpointKind::Savepoint, &[1, 3]);
    assert_eq!(shared_ids(backend).len(), 3);
    commit_incremental(store.as_ref(), 5, CheckpointKind::Checkpoint, &[]);
    commit_incremental(store.as_ref(), 6, CheckpointKind::Checkpoint, &[5]);
    // Nothing refers to 1, 2 and 3 any more; the savepoint still loads.
    assert_eq!(
        shared_ids(backend).len(),
        2,
        "{}: {:?}",
        backend.name(),
        shared_ids(backend)
    );
    assert_eq!(
        store.load(4).unwrap().parts[&PartId::new("Count", 0)],
        expected
    );
    // A damaged shared object invalidates the checkpoints that use it.
    let damaged = format!(
        "shared/{}/0-{:020}.shared",
        names::operator_dir_name("Count").unwrap(),
        5
    );
    backend.put(&damaged, b"rot");
    let report = store.load_latest().unwrap();
    assert_eq!(
        report.checkpoint.unwrap().metadata.checkpoint,
        4,
        "{}",
        backend.name()
    );
    assert_eq!(
        report
            .skipped
            .iter()
            .map(|skip| skip.checkpoint)
            .collect::<Vec<_>>(),
        vec![6, 5]
    );
}

fn check_leftovers_and_tools(backend: &Backend) {
    let options = StoreOptions {
        retained_checkpoints: 3,
    };
    let leftovers = |backend: &Backend| -> Vec<Leftover> {
        match backend {
            Backend::Fs(dir) => FsCheckpointStore::open_read_only(dir.path(), JOB)
                .unwrap()
                .leftovers()
                .unwrap(),
            Backend::Object { .. } => {
                let store = backend.open_object(options.clone()).unwrap();
                store.leftovers().unwrap()
            }
        }
    };
    {
        let store = backend.open(3);
        commit(store.as_ref(), 1, CheckpointKind::Checkpoint);
        commit(store.as_ref(), 2, CheckpointKind::Checkpoint);
        store.begin(3, CheckpointKind::Checkpoint).unwrap();
        store
            .write_part(3, &PartId::new("source", 0), b"interrupted")
            .unwrap();
    }
    let found = leftovers(backend);
    assert!(
        matches!(
            found.as_slice(),
            [Leftover::Incomplete { checkpoint: 3, .. }]
        ),
        "{}: {found:?}",
        backend.name()
    );
    match backend {
        Backend::Fs(dir) => {
            let store = FsCheckpointStore::open(dir.path(), JOB).unwrap();
            assert_eq!(store.prune(1).unwrap(), vec![1]);
            assert_eq!(store.delete(2).unwrap(), CheckpointKind::Checkpoint);
        }
        Backend::Object { .. } => {
            let store = backend.open_object(options).unwrap();
            assert_eq!(store.prune(1).unwrap(), vec![1]);
            assert_eq!(store.delete(2).unwrap(), CheckpointKind::Checkpoint);
            assert!(listed(&store).is_empty());
        }
    }
}

macro_rules! on_every_backend {
    ($($name:ident => $check:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                for backend in backends() {
                    eprintln!("{}: {}", stringify!($check), backend.name());
                    $check(&backend);
                }
            }
        )*
    };
}

on_every_backend! {
    round_trip_retention_and_savepoints => check_round_trip_retention_and_savepoints,
    damaged_part_falls_back_and_is_set_aside => check_damaged_part_falls_back_and_is_set_aside,
    uncommitted_is_invisible_and_cleaned => check_uncommitted_is_invisible_and_cleaned,
    pins_hold_back_retention => check_pins_hold_back_retention,
    incremental_shared_objects => check_incremental_shared_objects,
    leftovers_and_tools => check_leftovers_and_tools,
}

// ----- object storage only -----

fn object_backends() -> Vec<Backend> {
    let mut all = vec![memory_backend()];
    all.extend(s3_backend());
    all
}

fn assert_in_use(result: Result<impl std::fmt::Debug, StoreError>, what: &str) {
    match result {
        Err(error @ StoreError::StoreInUse { .. }) => {
            assert!(!error.is_retryable(), "{what}");
            assert!(error.to_string().contains("owner epoch"), "{what}: {error}");
        }
        other => panic!("{what}: expected StoreInUse, got {other:?}"),
    }
}

/// Two writers on one location: the one taken over can neither commit
/// nor delete nor set aside, and what was committed stays as it was.
#[test]
fn a_store_taken_over_cannot_commit_or_delete() {
    for backend in object_backends() {
        let options = StoreOptions::default();
        let first = backend.open_object(options.clone()).unwrap();
        commit(&first, 1, CheckpointKind::Checkpoint);
        first.begin(2, CheckpointKind::Checkpoint).unwrap();
        first
            .write_part(2, &PartId::new("source", 0), b"late")
            .unwrap();
        let second = backend.open_object(options).unwrap();
        assert_in_use(first.commit(2, CommitRequest::default()), "commit");
        assert_in_use(first.delete(1), "delete");
        assert_in_use(first.set_aside(1, "no reason"), "set aside");
        // The second sees only what was committed, intact.
        assert_eq!(listed(&second), vec![1], "{}", backend.name());
        let loaded = second.load_latest().unwrap();
        assert!(loaded.skipped.is_empty());
        assert_eq!(loaded.checkpoint.unwrap().metadata.checkpoint, 1);
        // It numbers above the first's leftover and commits.
        assert_eq!(second.highest_id().unwrap(), Some(2));
        commit(&second, 3, CheckpointKind::Checkpoint);
        assert_eq!(listed(&second), vec![1, 3]);
        assert_in_use(first.commit(2, CommitRequest::default()), "commit again");
        drop(first);
        assert_eq!(listed(&second), vec![1, 3]);
    }
}

/// Both writers race for one id: exactly one commit wins.
#[test]
fn of_two_racing_commits_one_wins() {
    for backend in object_backends() {
        let first = backend.open_object(StoreOptions::default()).unwrap();
        first.begin(1, CheckpointKind::Checkpoint).unwrap();
        first
            .write_part(1, &PartId::new("source", 0), b"first")
            .unwrap();
        let second = backend.open_object(StoreOptions::default()).unwrap();
        second.begin(1, CheckpointKind::Checkpoint).unwrap();
        second
            .write_part(1, &PartId::new("source", 0), b"second")
            .unwrap();
        let results = std::thread::scope(|scope| {
            let one = scope.spawn(|| first.commit(1, CommitRequest::default()));
            let two = scope.spawn(|| second.commit(1, CommitRequest::default()));
            [one.join().unwrap().is_ok(), two.join().unwrap().is_ok()]
        });
        assert_eq!(
            results,
            [false, true],
            "{}: the owner is the later opener",
            backend.name()
        );
        let loaded = second.load(1).unwrap();
        assert_eq!(loaded.parts[&PartId::new("source", 0)], b"second");
    }
}

/// A read-only store lists what is committed and refuses every write.
#[test]
fn read_only_lists_and_refuses_writes() {
    let Some(backend) = s3_backend() else { return };
    let Backend::Object {
        location,
        settings: Some(settings),
        ..
    } = &backend
    else {
        unreachable!()
    };
    let owner = backend.open_object(StoreOptions::default()).unwrap();
    commit(&owner, 1, CheckpointKind::Checkpoint);
    let reader = ObjectCheckpointStore::open_s3_read_only(location, JOB, settings).unwrap();
    assert_eq!(listed(&reader), vec![1]);
    commit(&owner, 2, CheckpointKind::Checkpoint);
    assert_eq!(listed(&reader), vec![1, 2]);
    assert!(matches!(
        reader.begin(3, CheckpointKind::Checkpoint),
        Err(StoreError::ReadOnly { .. })
    ));
    assert!(matches!(reader.delete(1), Err(StoreError::ReadOnly { .. })));
}

fn problem_of(result: Result<ObjectCheckpointStore, StoreError>) -> (ObjectStoreProblem, String) {
    match result {
        Err(error @ StoreError::ObjectStore { .. }) => {
            let StoreError::ObjectStore { problem, .. } = &error else {
                unreachable!()
            };
            (*problem, error.to_string())
        }
        other => panic!("expected an object store error, got {other:?}"),
    }
}

/// A bucket that does not exist says so, and is not retryable.
#[test]
fn a_missing_bucket_is_named() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let location = format!("s3://{}/x", unique("missing"));
    let (problem, text) = problem_of(ObjectCheckpointStore::open_s3(
        &location,
        JOB,
        StoreOptions::default(),
        &settings(&endpoint),
    ));
    assert_eq!(problem, ObjectStoreProblem::NoSuchBucket, "{text}");
    assert!(text.contains("create it"), "{text}");
    assert!(!problem.is_retryable());
}

/// An endpoint nobody listens on is unreachable, and retryable.
#[test]
fn an_unreachable_endpoint_is_named() {
    // Port 9 (discard) on loopback: nothing listens there.
    let (problem, text) = problem_of(ObjectCheckpointStore::open_s3(
        "s3://bucket/x",
        JOB,
        StoreOptions::default(),
        &settings("http://127.0.0.1:9"),
    ));
    assert_eq!(problem, ObjectStoreProblem::Unreachable, "{text}");
    assert!(text.contains("AWS_ENDPOINT_URL"), "{text}");
    assert!(problem.is_retryable());
}

/// Missing credentials and malformed locations are refused before any
/// request, saying what to set.
#[test]
fn missing_credentials_and_bad_locations_are_named() {
    let mut no_keys = settings("http://127.0.0.1:9");
    no_keys.secret_access_key = None;
    let (problem, text) = problem_of(ObjectCheckpointStore::open_s3(
        "s3://bucket/x",
        JOB,
        StoreOptions::default(),
        &no_keys,
    ));
    assert_eq!(problem, ObjectStoreProblem::Configuration);
    assert!(text.contains("AWS_SECRET_ACCESS_KEY"), "{text}");
    let (problem, _) = problem_of(ObjectCheckpointStore::open_s3(
        "s3:///x",
        JOB,
        StoreOptions::default(),
        &settings("http://127.0.0.1:9"),
    ));
    assert_eq!(problem, ObjectStoreProblem::Configuration);
    let remote_http = settings("http://storage.example.com");
    let (problem, text) = problem_of(ObjectCheckpointStore::open_s3(
        "s3://bucket/x",
        JOB,
        StoreOptions::default(),
        &remote_http,
    ));
    assert_eq!(problem, ObjectStoreProblem::Configuration);
    assert!(text.contains("AWS_ALLOW_HTTP"), "{text}");
}

/// A moto server of this test's own with credential checks on
/// (`INITIAL_NO_AUTH_ACTION_COUNT=0`), killed when dropped; the shared
/// server checks none.
struct CheckingServer {
    child: std::process::Child,
    endpoint: String,
}

impl CheckingServer {
    /// Starts `SNAPFLOW_MOTO_SERVER` (printed by `.ci/s3.sh`) on a free
    /// port; `None` (skipping) outside CI when the variable is unset.
    fn start() -> Option<Self> {
        let binary = std::env::var("SNAPFLOW_MOTO_SERVER")
            .ok()
            .filter(|value| !value.is_empty());
        let Some(binary) = binary else {
            let ci = std::env::var("CI").is_ok_and(|value| value == "true");
            assert!(
                !ci,
                "SNAPFLOW_MOTO_SERVER is not set, and CI must not skip this test"
            );
            eprintln!(
                "skipped: SNAPFLOW_MOTO_SERVER is not set; `eval \"$(.ci/s3.sh start)\"` sets it"
            );
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("INITIAL_NO_AUTH_ACTION_COUNT", "0")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let server = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "moto did not listen within 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Some(server)
    }
}

impl Drop for CheckingServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Credentials the server does not know are refused, named, and not
/// retried.
#[test]
fn refused_credentials_are_named() {
    let Some(server) = CheckingServer::start() else {
        return;
    };
    let (problem, text) = problem_of(ObjectCheckpointStore::open_s3(
        "s3://bucket/x",
        JOB,
        StoreOptions::default(),
        &settings(&server.endpoint),
    ));
    assert_eq!(problem, ObjectStoreProblem::BadCredentials, "{text}");
    assert!(text.contains("AWS_SECRET_ACCESS_KEY"), "{text}");
    assert!(!problem.is_retryable());
}
