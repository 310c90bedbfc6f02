//! Objects on the test S3 server (moto, from `.ci/s3.sh`), read and
//! written behind a checkpoint store's back with plain HTTP: the recovery
//! tests damage and forge a store on S3 through this client, which is
//! their own and shares no code with the store's.
//!
//! moto checks no signature, but refuses an anonymous request, so the
//! requests carry a placeholder `Authorization` header. Keys are the
//! store's, which only hold characters that need no escaping in a URL
//! (lowercase letters, digits, `-`, `_`, `.` and `/`).

use std::path::Path;
use std::time::Duration;

use snapflow::storage::{ObjectCheckpointStore, S3Settings, StoreError, StoreOptions};

use crate::servers::{server_from_env, unique_name};
use crate::tansu::{create_bucket, S3_ENDPOINT_VAR};

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Credentials moto accepts (it checks none).
const KEY: &str = "snapflow";
/// A signature-shaped header for moto, which checks only that it is there.
const AUTHORIZATION: &str = "AWS4-HMAC-SHA256 \
    Credential=snapflow/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";

/// A key prefix of a bucket on the test server, under which a store
/// lives: `s3://<bucket>/<prefix>`.
#[derive(Debug, Clone)]
pub struct S3Prefix {
    /// The server, `http://host:port`.
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The key prefix, without a trailing `/`.
    pub prefix: String,
}

impl S3Prefix {
    /// A fresh bucket on the server [`S3_ENDPOINT_VAR`] names, or `None`
    /// (with a message) outside CI when it is not set; in CI a missing
    /// server fails the test. `what` names the tests.
    pub fn fresh_bucket(what: &str) -> Option<S3Prefix> {
        let endpoint = server_from_env(S3_ENDPOINT_VAR, what, ".ci/s3.sh")?;
        let bucket = unique_name("damage", '-').to_lowercase();
        create_bucket(&endpoint, &bucket);
        Some(S3Prefix {
            endpoint,
            bucket,
            prefix: "jobs".to_string(),
        })
    }

    /// Another prefix in the same bucket, unique to this process.
    pub fn unique(&self, what: &str) -> S3Prefix {
        S3Prefix {
            prefix: unique_name(what, '-').to_lowercase(),
            ..self.clone()
        }
    }

    /// `s3://<bucket>/<prefix>`.
    pub fn location(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// The settings that reach the server.
    pub fn settings(&self) -> S3Settings {
        S3Settings {
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".to_string()),
            access_key_id: Some(KEY.to_string()),
            secret_access_key: Some(KEY.to_string()),
            ..S3Settings::default()
        }
    }

    /// Opens the store of `job` here as its owner (taking it over).
    pub fn open(&self, job: &str) -> Result<ObjectCheckpointStore, StoreError> {
        ObjectCheckpointStore::open_s3(
            &self.location(),
            job,
            StoreOptions::default(),
            &self.settings(),
        )
    }

    /// Opens the store of `job` here read-only (no takeover).
    pub fn open_read_only(&self, job: &str) -> ObjectCheckpointStore {
        ObjectCheckpointStore::open_s3_read_only(&self.location(), job, &self.settings())
            .expect("the store opens read-only")
    }

    /// The key of a path the store names, `s3://<bucket>/<key>`.
    pub fn key_of(&self, path: &Path) -> String {
        let text = path.to_str().expect("a UTF-8 path");
        text.strip_prefix(&format!("s3://{}/", self.bucket))
            .unwrap_or_else(|| panic!("{text} is not in bucket {}", self.bucket))
            .to_string()
    }

    /// The key of `relative` under the prefix.
    pub fn key(&self, relative: &str) -> String {
        format!("{}/{relative}", self.prefix)
    }

    fn url(&self, key: &str) -> String {
        format!("{}/{}/{key}", self.endpoint, self.bucket)
    }

    /// The object `key`'s bytes, or `None` when it does not exist.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        match ureq::get(&self.url(key))
            .timeout(TIMEOUT)
            .set("Authorization", AUTHORIZATION)
            .call()
        {
            Ok(response) => {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut response.into_reader(), &mut bytes)
                    .unwrap_or_else(|error| panic!("reading object {key}: {error}"));
                Some(bytes)
            }
            Err(ureq::Error::Status(404, _)) => None,
            Err(error) => panic!("getting object {key}: {error}"),
        }
    }

    /// Writes the object `key`.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        ureq::put(&self.url(key))
            .timeout(TIMEOUT)
            .set("Authorization", AUTHORIZATION)
            .send_bytes(bytes)
            .unwrap_or_else(|error| panic!("putting object {key}: {error}"));
    }

    /// Deletes the object `key` (a missing one too).
    pub fn delete(&self, key: &str) {
        ureq::delete(&self.url(key))
            .timeout(TIMEOUT)
            .set("Authorization", AUTHORIZATION)
            .call()
            .unwrap_or_else(|error| panic!("deleting object {key}: {error}"));
    }

    /// Copies the object `from` to `to` on the server.
    pub fn copy(&self, from: &str, to: &str) {
        self.copy_into(from, self, to);
    }

    /// Copies the object `from` here to `to` in `into`'s bucket.
    fn copy_into(&self, from: &str, into: &S3Prefix, to: &str) {
        ureq::put(&into.url(to))
            .timeout(TIMEOUT)
            .set("Authorization", AUTHORIZATION)
            .set("x-amz-copy-source", &format!("/{}/{from}", self.bucket))
            .call()
            .unwrap_or_else(|error| panic!("copying object {from} to {to}: {error}"));
    }

    /// The keys under `prefix/`, sorted (every page of the listing).
    pub fn list(&self, prefix: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut request = ureq::get(&format!("{}/{}", self.endpoint, self.bucket))
                .timeout(TIMEOUT)
                .set("Authorization", AUTHORIZATION)
                .query("list-type", "2")
                .query("prefix", &format!("{prefix}/"));
            if let Some(token) = &token {
                request = request.query("continuation-token", token);
            }
            let answer = request
                .call()
                .unwrap_or_else(|error| panic!("listing {prefix}: {error}"))
                .into_string()
                .unwrap_or_else(|error| panic!("reading the listing of {prefix}: {error}"));
            keys.extend(elements(&answer, "Key"));
            token = elements(&answer, "NextContinuationToken")
                .into_iter()
                .next();
            if token.is_none() {
                break;
            }
        }
        keys.sort();
        keys
    }

    /// Copies every object under this prefix to the same place under
    /// `to`'s prefix (in `to`'s bucket).
    pub fn copy_all(&self, to: &S3Prefix) {
        for key in self.list(&self.prefix) {
            let relative = &key[self.prefix.len() + 1..];
            self.copy_into(&key, to, &to.key(relative));
        }
    }
}

/// The texts of every `<name>` element of `xml` (unescaped).
fn elements(xml: &str, name: &str) -> Vec<String> {
    let (open, close) = (format!("<{name}>"), format!("</{name}>"));
    let mut found = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else {
            break;
        };
        found.push(
            after[..end]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
        rest = &after[end + close.len()..];
    }
    found
}
