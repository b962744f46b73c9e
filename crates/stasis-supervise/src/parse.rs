//! Durations and sizes as the command line writes them.

use std::time::Duration;

/// A command-line value that could not be parsed; the message gives
/// examples of what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{0:?} is not a duration (examples: 90, 90s, 15m, 2h, 1d)")]
    Duration(String),
    #[error("{0:?} must be a positive duration")]
    NotPositive(String),
    #[error("{0:?} is not a size (examples: 0, 64M, 1G)")]
    Size(String),
    #[error("--touch-window takes seconds or `auto`, not {0:?}")]
    TouchWindow(String),
    #[error("unknown method {0:?}: use auto, uffd or fork")]
    CowMethod(String),
}

/// Parses "90", "90s", "15m", "2h", "1d" (also fractions: "0.5s").
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1.0),
        Some((i, 'm')) => (&s[..i], 60.0),
        Some((i, 'h')) => (&s[..i], 3600.0),
        Some((i, 'd')) => (&s[..i], 86400.0),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| ParseError::Duration(s.to_string()))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(ParseError::NotPositive(s.to_string()));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// Parses a size: "512" (bytes), "64K", "256M", "1G" (powers of 1024), or
/// "0" for none.
pub fn parse_size(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| ParseError::Size(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("0.5s").unwrap(), Duration::from_millis(500));
        assert_eq!(
            parse_duration("soon"),
            Err(ParseError::Duration("soon".into()))
        );
        assert_eq!(
            parse_duration("-3s"),
            Err(ParseError::NotPositive("-3s".into()))
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
