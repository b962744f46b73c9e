//! Where a store is: a local image directory, `s3://BUCKET/PREFIX` (the
//! server from `AWS_ENDPOINT_URL`), or `s3+http://HOST:PORT/BUCKET/PREFIX`
//! (`s3+https://...`): a server named in the URL, for replicas on servers
//! of their own.

use std::path::PathBuf;

use crate::StoreError;

/// A `-D` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local image directory (docs/image-format.md).
    Dir(PathBuf),
    /// An S3 bucket and a key prefix (empty, or ending in `/`), on the
    /// server `endpoint` (`None`: the environment's).
    S3 {
        bucket: String,
        prefix: String,
        endpoint: Option<String>,
    },
}

impl Location {
    /// Parses `s3://BUCKET[/PREFIX]`; anything else is a directory path.
    pub fn parse(arg: &str) -> Result<Location, StoreError> {
        let bad = |reason: &str| StoreError::BadUrl {
            url: arg.into(),
            reason: reason.into(),
        };
        let (endpoint, rest) = if let Some(r) = arg.strip_prefix("s3://") {
            (None, r)
        } else if let Some((scheme, r)) = arg
            .strip_prefix("s3+http://")
            .map(|r| ("http", r))
            .or_else(|| arg.strip_prefix("s3+https://").map(|r| ("https", r)))
        {
            let (host, r) = r
                .split_once('/')
                .ok_or_else(|| bad("no bucket after the server"))?;
            if host.is_empty() {
                return Err(bad("no server"));
            }
            (Some(format!("{scheme}://{host}")), r)
        } else {
            return Ok(Location::Dir(PathBuf::from(arg)));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(bad(
                "a bucket name has 3 to 63 lowercase letters, digits, '-' or '.'",
            ));
        }
        let parts: Vec<&str> = prefix.split('/').filter(|p| !p.is_empty()).collect();
        if parts.iter().any(|p| *p == "." || *p == "..") {
            return Err(bad("the prefix may not contain '.' or '..' components"));
        }
        let prefix = if parts.is_empty() {
            String::new()
        } else {
            format!("{}/", parts.join("/"))
        };
        Ok(Location::S3 {
            bucket: bucket.into(),
            prefix,
            endpoint,
        })
    }

    /// The URL or path, for messages.
    pub fn display(&self) -> String {
        match self {
            Location::Dir(p) => p.display().to_string(),
            Location::S3 {
                bucket,
                prefix,
                endpoint,
            } => match endpoint.as_deref().and_then(|e| e.split_once("://")) {
                Some((scheme, host)) => format!(
                    "s3+{scheme}://{host}/{bucket}/{}",
                    prefix.trim_end_matches('/')
                ),
                None => format!("s3://{bucket}/{}", prefix.trim_end_matches('/')),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls_and_paths() {
        assert_eq!(
            Location::parse("s3://bkt/a//b/").unwrap(),
            Location::S3 {
                bucket: "bkt".into(),
                prefix: "a/b/".into(),
                endpoint: None,
            }
        );
        assert_eq!(
            Location::parse("s3://bkt").unwrap(),
            Location::S3 {
                bucket: "bkt".into(),
                prefix: String::new(),
                endpoint: None,
            }
        );
        assert_eq!(
            Location::parse("/tmp/x").unwrap(),
            Location::Dir("/tmp/x".into())
        );
        assert!(Location::parse("s3://B/x").is_err());
        assert!(Location::parse("s3://bkt/../x").is_err());
        assert_eq!(
            Location::parse("s3://bkt/a/b").unwrap().display(),
            "s3://bkt/a/b"
        );
    }
}
