//! Where work runs, as a user names it: `cpu`, `cuda` (the first GPU) or `cuda:N`. Parsed once,
//! where a setting or a flag enters (ripgrep's low-level arguments: nothing below the reader
//! sees the string), and opened into a candle device where the work starts.
//!
//! Keeps the spelling it was given (`cuda` and `cuda:0` are the same GPU but print as typed), so
//! settings serialised into a stage's key keep their key. Knows nothing of settings files or
//! flags: their readers name the key or flag in their errors.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A device a stage, a job or a benchmark runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    /// A CUDA GPU: `None` as `cuda` (the first), `Some(n)` as `cuda:n`.
    Cuda(Option<usize>),
}

impl DeviceSpec {
    pub fn is_cpu(self) -> bool {
        self == DeviceSpec::Cpu
    }

    pub fn is_cuda(self) -> bool {
        !self.is_cpu()
    }

    /// The CUDA ordinal (0 for `cuda`); `None` on the CPU.
    pub fn ordinal(self) -> Option<usize> {
        match self {
            DeviceSpec::Cpu => None,
            DeviceSpec::Cuda(n) => Some(n.unwrap_or(0)),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = String;

    /// `cpu`, `cuda` or `cuda:N`; the error says what was given.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(None)),
            // N as digits without leading zeros, so that it prints as typed
            _ => match s.strip_prefix("cuda:").map(|n| (n, n.parse::<usize>())) {
                Some((text, Ok(n))) if n.to_string() == text => Ok(DeviceSpec::Cuda(Some(n))),
                _ => Err(format!("must be cpu, cuda or cuda:N, got `{s}`")),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(None) => f.write_str("cuda"),
            DeviceSpec::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl Serialize for DeviceSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceSpec;

    #[test]
    fn devices_parse_and_print_as_typed() {
        for (s, want) in [
            ("cpu", DeviceSpec::Cpu),
            ("cuda", DeviceSpec::Cuda(None)),
            ("cuda:0", DeviceSpec::Cuda(Some(0))),
            ("cuda:3", DeviceSpec::Cuda(Some(3))),
        ] {
            let d: DeviceSpec = s.parse().unwrap();
            assert_eq!(d, want);
            assert_eq!(d.to_string(), s);
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<DeviceSpec>(&json).unwrap(), d);
        }
        assert_eq!(DeviceSpec::Cuda(None).ordinal(), Some(0));
        for bad in [
            "gpu", "cuda:", "cuda:x", "CUDA", "cuda0", "", "cuda:01", "cuda:+1",
        ] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert_eq!(e, format!("must be cpu, cuda or cuda:N, got `{bad}`"));
        }
    }
}
