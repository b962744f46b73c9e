//! Where a store is: a local image directory or `s3://BUCKET/PREFIX`.

use std::path::PathBuf;

use crate::StoreError;

/// A `-D` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local image directory (docs/image-format.md).
    Dir(PathBuf),
    /// An S3 bucket and a key prefix (empty, or ending in `/`).
    S3 { bucket: String, prefix: String },
}

impl Location {
    /// Parses `s3://BUCKET[/PREFIX]`; anything else is a directory path.
    pub fn parse(arg: &str) -> Result<Location, StoreError> {
        let Some(rest) = arg.strip_prefix("s3://") else {
            return Ok(Location::Dir(PathBuf::from(arg)));
        };
        let bad = |reason: &str| StoreError::BadUrl {
            url: arg.into(),
            reason: reason.into(),
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
        })
    }

    /// The URL or path, for messages.
    pub fn display(&self) -> String {
        match self {
            Location::Dir(p) => p.display().to_string(),
            Location::S3 { bucket, prefix } => {
                format!("s3://{bucket}/{}", prefix.trim_end_matches('/'))
            }
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
                prefix: "a/b/".into()
            }
        );
        assert_eq!(
            Location::parse("s3://bkt").unwrap(),
            Location::S3 {
                bucket: "bkt".into(),
                prefix: String::new()
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
