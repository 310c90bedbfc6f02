//! [`ObjectCheckpointStore`]: checkpoints on object storage (S3 and every
//! store the `object_store` crate reaches), behind the `s3` feature.
//!
//! It is the file store's engine on another [`Io`](super::io::Io)
//! (`object/io.rs`), so the layout, fallback past damaged parts, setting
//! damaged checkpoints aside, incremental checkpoints with shared
//! objects, retention, self-contained savepoints, pins and leftovers are
//! the file store's. What object storage changes is the commit and the
//! owner: a checkpoint exists once the pointer object names it, and the
//! pointer is updated only by a conditional write, so a store that was
//! taken over by another writer can never commit (see
//! docs/design/object-store.md). This module only parses locations, reads
//! the AWS environment and opens the engine; it never looks inside a
//! part.

mod bridge;
mod errors;
mod io;
mod pointer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use self::io::ObjectIo;
use super::engine::{delegate_store, Engine};
use super::{CheckpointKind, Leftover, ObjectStoreProblem, StoreError, StoreOptions};

/// The scheme of the locations [`ObjectCheckpointStore::open`] takes.
pub const S3_SCHEME: &str = "s3://";
/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take, a large part's upload included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a failed request is retried (throttling, server errors,
/// lost connections), and for how long at most.
const MAX_RETRIES: usize = 3;
const RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `location` names object storage (`s3://bucket/prefix`) rather
/// than a directory.
pub fn is_object_location(location: &str) -> bool {
    location.starts_with(S3_SCHEME)
}

/// A [`CheckpointStore`](super::CheckpointStore) on object storage.
///
/// Under `s3://bucket/prefix` each job gets `prefix/job-<escaped name>/`,
/// with the file store's layout inside and a `_pointer` object naming the
/// owner and every committed checkpoint. Opening takes the store over
/// (see [`ObjectCheckpointStore::open`]).
#[derive(Debug)]
pub struct ObjectCheckpointStore {
    engine: Engine,
}

impl ObjectCheckpointStore {
    /// Opens (as its owner) the checkpoints of `job` at `location`,
    /// `s3://bucket/prefix`, with default options. The endpoint, region
    /// and credentials come from the usual variables: `AWS_ENDPOINT_URL`,
    /// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`); plain `http://` is allowed for a loopback
    /// endpoint or with `AWS_ALLOW_HTTP=true`.
    ///
    /// Opening takes the store over: it raises the pointer's owner epoch
    /// by a conditional write. A process that owned the store before (one
    /// that was killed, or one that still runs) can no longer commit,
    /// delete or set aside anything: its next attempt fails with
    /// [`StoreError::StoreInUse`], which is not retryable.
    ///
    /// # Errors
    ///
    /// [`StoreError::ObjectStore`] for a malformed location, missing
    /// credentials, refused credentials, a missing bucket or an
    /// unreachable endpoint, each saying what to fix.
    pub fn open(location: &str, job: &str) -> Result<Self, StoreError> {
        Self::open_with(location, job, StoreOptions::default())
    }

    /// [`ObjectCheckpointStore::open`] with `options`.
    pub fn open_with(location: &str, job: &str, options: StoreOptions) -> Result<Self, StoreError> {
        Self::open_s3(location, job, options, &S3Settings::from_env())
    }

    /// [`ObjectCheckpointStore::open`] with `options` and explicit
    /// `settings` instead of the environment's.
    pub fn open_s3(
        location: &str,
        job: &str,
        options: StoreOptions,
        settings: &S3Settings,
    ) -> Result<Self, StoreError> {
        let (store, prefix) = settings.client(location)?;
        Self::with_object_store(store, location, prefix, job, options)
    }

    /// Opens the checkpoints of `job` at `location` without owning them:
    /// nothing is written, and every write is refused with
    /// [`StoreError::ReadOnly`]. What it lists and loads is what the
    /// pointer names when it reads it.
    pub fn open_read_only(location: &str, job: &str) -> Result<Self, StoreError> {
        Self::open_s3_read_only(location, job, &S3Settings::from_env())
    }

    /// [`ObjectCheckpointStore::open_read_only`] with explicit `settings`.
    pub fn open_s3_read_only(
        location: &str,
        job: &str,
        settings: &S3Settings,
    ) -> Result<Self, StoreError> {
        let (store, prefix) = settings.client(location)?;
        let io = object_io(store, location, prefix)?;
        let root = root_path(location);
        let engine = Engine::open_read_only(io.clone(), &root, job, StoreOptions::default())?;
        io.probe(engine.job_dir())
            .map_err(|error| StoreError::io("read", engine.job_dir(), error))?;
        Ok(Self { engine })
    }

    /// Opens (as its owner) the checkpoints of `job` on any object store
    /// the `object_store` crate offers (GCS, Azure, memory...), under the
    /// key `prefix`. `location` only names the store in paths and
    /// messages (e.g. `gs://bucket/prefix`). The store must support
    /// conditional puts (`PutMode::Create` and `PutMode::Update`).
    pub fn with_object_store(
        store: Arc<dyn ObjectStore>,
        location: &str,
        prefix: ObjectPath,
        job: &str,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        let io = object_io(store, location, prefix)?;
        let root = root_path(location);
        Ok(Self {
            engine: Engine::open(io, &root, job, options)?,
        })
    }

    /// The names of the jobs that have checkpoints at `location`, sorted:
    /// the `job-*` prefixes under it. It only lists.
    ///
    /// # Errors
    ///
    /// As [`ObjectCheckpointStore::open`].
    pub fn jobs_at(location: &str, settings: &S3Settings) -> Result<Vec<String>, StoreError> {
        let (store, prefix) = settings.client(location)?;
        let io = object_io(store, location, prefix)?;
        let root = root_path(location);
        let listing = super::io::Io::list_dir(io.as_ref(), &root)
            .map_err(|error| StoreError::io("list", &root, error))?;
        let mut jobs: Vec<String> = listing
            .into_iter()
            .filter(|entry| entry.is_dir)
            .filter_map(|entry| {
                let name = entry.name.strip_prefix("job-")?;
                super::names::decode_component(name)
            })
            .collect();
        jobs.sort();
        Ok(jobs)
    }

    /// Deletes complete checkpoint or savepoint `checkpoint` (removing it
    /// from the pointer first) and says which kind it was; as
    /// [`FsCheckpointStore::delete`](super::FsCheckpointStore::delete).
    pub fn delete(&self, checkpoint: u64) -> Result<CheckpointKind, StoreError> {
        self.engine.delete(checkpoint)
    }

    /// Deletes every complete checkpoint but the newest `keep`; as
    /// [`FsCheckpointStore::prune`](super::FsCheckpointStore::prune).
    pub fn prune(&self, keep: usize) -> Result<Vec<u64>, StoreError> {
        self.engine.prune(keep)
    }

    /// What the job's prefix holds besides its committed checkpoints and
    /// savepoints (metadata the pointer does not name reads as
    /// incomplete); as [`FsCheckpointStore::leftovers`](super::FsCheckpointStore::leftovers).
    pub fn leftovers(&self) -> Result<Vec<Leftover>, StoreError> {
        self.engine.leftovers()
    }

    /// The job's location, `s3://bucket/prefix/job-<escaped name>`.
    pub fn job_dir(&self) -> &Path {
        self.engine.job_dir()
    }

    /// Where checkpoint (or savepoint) `checkpoint` lives, whether or not
    /// it exists.
    pub fn entry_dir(&self, checkpoint: u64, kind: CheckpointKind) -> PathBuf {
        self.engine.entry_dir(checkpoint, kind)
    }

    fn directory(&self) -> Option<&Path> {
        Some(self.engine.job_dir())
    }
}

delegate_store!(ObjectCheckpointStore);

fn object_io(
    store: Arc<dyn ObjectStore>,
    location: &str,
    prefix: ObjectPath,
) -> Result<Arc<ObjectIo>, StoreError> {
    let root = root_path(location);
    ObjectIo::new(store, root.clone(), prefix)
        .map(Arc::new)
        .map_err(|error| StoreError::io("start the object store's runtime", root, error))
}

/// The path the engine is given as its root: the location without a
/// trailing slash.
fn root_path(location: &str) -> PathBuf {
    PathBuf::from(location.trim_end_matches('/'))
}

fn configuration(location: &str, detail: impl Into<String>) -> StoreError {
    StoreError::ObjectStore {
        location: location.to_string(),
        problem: ObjectStoreProblem::Configuration,
        detail: detail.into(),
    }
}

/// `(bucket, prefix)` of `s3://bucket/prefix`.
pub(crate) fn parse_s3_location(location: &str) -> Result<(String, ObjectPath), StoreError> {
    let rest = location.strip_prefix(S3_SCHEME).ok_or_else(|| {
        configuration(location, "an object-storage location is s3://bucket/prefix")
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(configuration(location, "the location names no bucket"));
    }
    let prefix = ObjectPath::parse(prefix.trim_matches('/')).map_err(|error| {
        configuration(location, format!("the prefix is not a valid key: {error}"))
    })?;
    Ok((bucket.to_string(), prefix))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// Whether `endpoint` is plain HTTP on this machine.
fn is_loopback_http(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return false;
    };
    ["127.", "localhost", "[::1]"]
        .iter()
        .any(|host| rest.starts_with(host))
}

/// Where an S3 server is and how to sign requests to it.
/// [`S3Settings::from_env`] reads the usual AWS variables.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Settings {
    /// The endpoint, e.g. `http://127.0.0.1:9000`; `None` for AWS itself.
    pub endpoint: Option<String>,
    /// The region; `us-east-1` when `None`.
    pub region: Option<String>,
    /// The access key id.
    pub access_key_id: Option<String>,
    /// The secret access key.
    pub secret_access_key: Option<String>,
    /// A session token, for temporary credentials.
    pub session_token: Option<String>,
    /// Whether plain `http://` is allowed on an endpoint that is not on
    /// this machine (it always is on loopback).
    pub allow_http: bool,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret and the token are never printed.
        formatter
            .debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("allow_http", &self.allow_http)
            .finish_non_exhaustive()
    }
}

impl S3Settings {
    /// The settings of the environment: `AWS_ENDPOINT_URL` (or
    /// `AWS_ENDPOINT`), `AWS_REGION` (or `AWS_DEFAULT_REGION`),
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`
    /// and `AWS_ALLOW_HTTP=true`.
    pub fn from_env() -> Self {
        Self {
            endpoint: env("AWS_ENDPOINT_URL").or_else(|| env("AWS_ENDPOINT")),
            region: env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")),
            access_key_id: env("AWS_ACCESS_KEY_ID"),
            secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
            session_token: env("AWS_SESSION_TOKEN"),
            allow_http: env("AWS_ALLOW_HTTP").is_some_and(|value| value == "true"),
        }
    }

    /// An S3 client for `location` with these settings, and the key
    /// prefix; typed errors for what is missing or malformed.
    fn client(&self, location: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath), StoreError> {
        let (bucket, prefix) = parse_s3_location(location)?;
        let (Some(key_id), Some(secret)) = (&self.access_key_id, &self.secret_access_key) else {
            return Err(configuration(
                location,
                "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ));
        };
        let allow_http = self.allow_http || self.endpoint.as_deref().is_some_and(is_loopback_http);
        if let Some(endpoint) = &self.endpoint {
            if endpoint.starts_with("http://") && !allow_http {
                return Err(configuration(
                    location,
                    "the endpoint is plain http on another machine; use https or set AWS_ALLOW_HTTP=true",
                ));
            }
        }
        let retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: MAX_RETRIES,
            retry_timeout: RETRY_TIMEOUT,
        };
        let client = ClientOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_allow_http(allow_http);
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(bucket)
            .with_region(self.region.as_deref().unwrap_or("us-east-1"))
            .with_access_key_id(key_id)
            .with_secret_access_key(secret)
            .with_client_options(client)
            .with_retry(retry)
            .with_conditional_put(S3ConditionalPut::ETagMatch);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(token) = &self.session_token {
            builder = builder.with_token(token);
        }
        let store = builder
            .build()
            .map_err(|error| configuration(location, error.to_string()))?;
        Ok((Arc::new(store), prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::{is_loopback_http, parse_s3_location};
    use crate::storage::{ObjectStoreProblem, StoreError};

    /// Locations parse into bucket and prefix; malformed ones say so.
    #[test]
    fn locations_parse() {
        let (bucket, prefix) = parse_s3_location("s3://jobs/prod/eu/").expect("parses");
        assert_eq!(bucket, "jobs");
        assert_eq!(prefix.as_ref(), "prod/eu");
        let (bucket, prefix) = parse_s3_location("s3://jobs").expect("parses");
        assert_eq!((bucket.as_str(), prefix.as_ref()), ("jobs", ""));
        for bad in ["s3:///prefix", "/tmp/x", "s3://b/a//b"] {
            match parse_s3_location(bad) {
                Err(StoreError::ObjectStore { problem, .. }) => {
                    assert_eq!(problem, ObjectStoreProblem::Configuration, "{bad}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(is_loopback_http("http://127.0.0.1:9000"));
        assert!(!is_loopback_http("http://example.com"));
    }
}
