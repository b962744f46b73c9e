//! A blocking client of one S3 bucket (object_store over a tokio runtime
//! owned here), with errors that say what to check.
//!
//! Configuration is the standard environment: `AWS_ENDPOINT_URL`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` (default
//! us-east-1), `AWS_ALLOW_HTTP=true` for an `http://` endpoint. Requests
//! are retried a few times over at most `RETRY_TIMEOUT`, so a server that
//! is down fails a command within seconds, not minutes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, RetryConfig,
};

use crate::StoreError;

const RETRY_TIMEOUT: Duration = Duration::from_secs(8);
/// Requests in flight at once in [`Bucket::put_many`] and [`Bucket::get_many`].
pub const IN_FLIGHT: usize = 8;

/// One bucket of an S3-compatible store.
pub struct Bucket {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    pub bucket: String,
    pub endpoint: String,
}

/// An object listed: its key and size.
#[derive(Debug, Clone)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    pub modified_unix: i64,
}

/// Explicit settings that override the environment's (tests, tools).
#[derive(Debug, Clone, Default)]
pub struct S3Config {
    pub endpoint: Option<String>,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    pub region: Option<String>,
    pub allow_http: Option<bool>,
}

impl Bucket {
    /// A client of `bucket`, configured from the environment.
    pub fn from_env(bucket: &str) -> Result<Bucket, StoreError> {
        Bucket::with_config(bucket, &S3Config::default())
    }

    /// A client of `bucket`: the environment, overridden by `cfg`.
    pub fn with_config(bucket: &str, cfg: &S3Config) -> Result<Bucket, StoreError> {
        let url = format!("s3://{bucket}");
        let endpoint = cfg
            .endpoint
            .clone()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .or_else(|| std::env::var("AWS_ENDPOINT").ok())
            .unwrap_or_else(|| "https://s3.amazonaws.com (AWS_ENDPOINT_URL unset)".into());
        let allow_http = cfg.allow_http.unwrap_or_else(|| {
            std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true" || v == "1")
        });
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            // Bodies are not hashed into the signature (UNSIGNED-PAYLOAD):
            // SHA-256 of every upload was a quarter of a dump's CPU, and
            // each chunk is checked end to end by its BLAKE3 name (and, with
            // a key, its AEAD tag) when it is read.
            .with_unsigned_payload(true)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: Duration::from_secs(1),
                    base: 2.0,
                },
                max_retries: 3,
                retry_timeout: RETRY_TIMEOUT,
            })
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120))
                    .with_allow_http(allow_http),
            );
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e);
        }
        if let Some(k) = &cfg.access_key {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &cfg.secret_key {
            b = b.with_secret_access_key(k);
        }
        if let Some(r) = &cfg.region {
            b = b.with_region(r);
        }
        if cfg.region.is_none()
            && std::env::var("AWS_REGION").is_err()
            && std::env::var("AWS_DEFAULT_REGION").is_err()
        {
            b = b.with_region("us-east-1");
        }
        let store = b.build().map_err(|source| StoreError::Config {
            url,
            source: Box::new(source),
        })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            // The process's signals are for its own threads (a dump's
            // clean-up, an agent's or a page server's stop): a worker that
            // took SIGTERM would end the process without them.
            .on_thread_start(|| {
                let mut set = nix::sys::signal::SigSet::empty();
                for s in [
                    nix::sys::signal::Signal::SIGINT,
                    nix::sys::signal::Signal::SIGTERM,
                    nix::sys::signal::Signal::SIGHUP,
                ] {
                    set.add(s);
                }
                let _ = set.thread_block();
            })
            .build()
            .map_err(StoreError::local("start the I/O runtime", "tokio"))?;
        Ok(Bucket {
            rt,
            store: Arc::new(store),
            bucket: bucket.into(),
            endpoint,
        })
    }

    /// Maps an object_store error to one that says what to check.
    pub fn error(&self, action: &'static str, key: &str, e: object_store::Error) -> StoreError {
        let detail = error_chain(&e);
        let lower = detail.to_lowercase();
        let endpoint = self.endpoint.clone();
        let key = key.to_string();
        if lower.contains("nosuchbucket") || lower.contains("specified bucket does not exist") {
            return StoreError::NoBucket {
                endpoint,
                bucket: self.bucket.clone(),
            };
        }
        match e {
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => StoreError::Credentials {
                endpoint,
                action,
                key,
                detail,
            },
            object_store::Error::NotFound { .. } => StoreError::Missing {
                url: format!("s3://{}", self.bucket),
                action,
                key,
            },
            _ if lower.contains("connect")
                || lower.contains("connection")
                || lower.contains("timed out")
                || lower.contains("dns") =>
            {
                StoreError::Unreachable {
                    endpoint,
                    action,
                    key,
                    detail,
                }
            }
            _ if lower.contains("accessdenied")
                || lower.contains("signaturedoesnotmatch")
                || lower.contains("invalidaccesskeyid") =>
            {
                StoreError::Credentials {
                    endpoint,
                    action,
                    key,
                    detail,
                }
            }
            source => StoreError::Remote {
                endpoint,
                action,
                key,
                source: Box::new(source),
            },
        }
    }

    /// Writes `key`.
    pub fn put(&self, key: &str, data: Vec<u8>) -> Result<(), StoreError> {
        let p = ObjPath::from(key);
        self.rt
            .block_on(self.store.put(&p, Bytes::from(data).into()))
            .map(|_| ())
            .map_err(|e| self.error("writing", key, e))
    }

    /// Writes `key` only if it does not exist (`If-None-Match: *`);
    /// `Ok(false)` if it did.
    pub fn put_new(&self, key: &str, data: Vec<u8>) -> Result<bool, StoreError> {
        let p = ObjPath::from(key);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .rt
            .block_on(self.store.put_opts(&p, Bytes::from(data).into(), opts))
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.error("creating", key, e)),
        }
    }

    /// Writes many objects, `IN_FLIGHT` at a time, as `next` produces them
    /// (it runs on this thread while earlier ones upload).
    pub fn put_many(
        &self,
        mut next: impl FnMut() -> Result<Option<(String, Vec<u8>)>, StoreError>,
    ) -> Result<u64, StoreError> {
        let mut set = tokio::task::JoinSet::new();
        let mut bytes = 0u64;
        loop {
            while set.len() >= IN_FLIGHT {
                self.join_one(&mut set)?;
            }
            let Some((key, data)) = next()? else { break };
            bytes += data.len() as u64;
            let store = Arc::clone(&self.store);
            let _guard = self.rt.enter();
            set.spawn(async move {
                let r = store
                    .put(&ObjPath::from(key.as_str()), Bytes::from(data).into())
                    .await;
                (key, r.map(|_| ()))
            });
        }
        while !set.is_empty() {
            self.join_one(&mut set)?;
        }
        Ok(bytes)
    }

    fn join_one(
        &self,
        set: &mut tokio::task::JoinSet<(String, object_store::Result<()>)>,
    ) -> Result<(), StoreError> {
        match self.rt.block_on(set.join_next()) {
            Some(Ok((_, Ok(())))) | None => Ok(()),
            Some(Ok((key, Err(e)))) => Err(self.error("writing", &key, e)),
            Some(Err(e)) => Err(self.error("writing", "?", object_store::Error::from(e))),
        }
    }

    /// Reads `key`.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let p = ObjPath::from(key);
        self.rt
            .block_on(async { self.store.get(&p).await?.bytes().await })
            .map(|b| b.to_vec())
            .map_err(|e| self.error("reading", key, e))
    }

    /// Reads `keys`, `IN_FLIGHT` at a time, handing each to `each` (on
    /// this thread) in the order given. Each GET runs as a task of the
    /// runtime, so the bodies in flight keep arriving while `each` works
    /// on an earlier one.
    pub fn get_many(
        &self,
        keys: Vec<String>,
        mut each: impl FnMut(usize, Bytes) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let store = Arc::clone(&self.store);
        let rt = self.rt.handle().clone();
        let fut = futures::stream::iter(keys.into_iter().map(move |key| {
            let store = Arc::clone(&store);
            rt.spawn(async move {
                let r =
                    async { store.get(&ObjPath::from(key.as_str())).await?.bytes().await }.await;
                (key, r)
            })
        }))
        .buffered(IN_FLIGHT)
        .enumerate();
        self.rt.block_on(async {
            futures::pin_mut!(fut);
            while let Some((i, joined)) = fut.next().await {
                let (key, r) =
                    joined.map_err(|e| self.error("reading", "?", object_store::Error::from(e)))?;
                let data = r.map_err(|e| self.error("reading", &key, e))?;
                each(i, data)?;
            }
            Ok(())
        })
    }

    /// Lists the objects under `prefix` (empty: the whole bucket).
    pub fn list(&self, prefix: &str) -> Result<Vec<Listed>, StoreError> {
        let p = (!prefix.is_empty()).then(|| ObjPath::from(prefix));
        let v: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(self.store.list(p.as_ref()).try_collect())
            .map_err(|e| self.error("listing", prefix, e))?;
        Ok(v.into_iter()
            .map(|m| Listed {
                key: m.location.to_string(),
                size: m.size,
                modified_unix: m.last_modified.timestamp(),
            })
            .collect())
    }

    /// The "directories" right under `prefix` (a `/`-delimited listing):
    /// their names, without the prefix or the trailing `/`.
    pub fn list_dirs(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let p = ObjPath::from(prefix);
        let r = self
            .rt
            .block_on(self.store.list_with_delimiter(Some(&p)))
            .map_err(|e| self.error("listing", prefix, e))?;
        Ok(r.common_prefixes
            .iter()
            .filter_map(|d| d.filename().map(str::to_string))
            .collect())
    }

    /// Deletes `key` (missing is fine).
    pub fn delete(&self, key: &str) -> Result<(), StoreError> {
        let p = ObjPath::from(key);
        match self.rt.block_on(self.store.delete(&p)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("deleting", key, e)),
        }
    }
}

/// An error and its sources, on one line; an S3 error document is
/// shortened to its code and message.
fn error_chain(e: &dyn std::error::Error) -> String {
    let s = stasis_image::one_line(e);
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let start = s.find(&open)? + open.len();
        let len = s[start..].find(&format!("</{t}>"))?;
        Some(s[start..start + len].to_string())
    };
    match (s.find("<?xml"), tag("Code"), tag("Message")) {
        (Some(at), Some(code), message) => {
            format!("{}{code}: {}", &s[..at], message.unwrap_or_default())
        }
        _ => s.chars().take(600).collect(),
    }
}
