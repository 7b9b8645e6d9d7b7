//! Errors as one line of text: the message, then each cause in the chain after `: `. Error
//! messages state their own context and leave their cause to `source()`, so wherever an error
//! becomes text (a log field, a collector's down reason, a command's last line) it is written
//! through [`Chain`], and each cause appears exactly once.

use std::{error::Error, fmt};

/// Displays an error and every error in its `source()` chain, separated by `: `.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {what}")]
    struct Outer {
        what: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn each_cause_once_in_order() {
        let e = Outer {
            what: "x",
            source: std::io::Error::other("disk on fire"),
        };
        assert_eq!(Chain(&e).to_string(), "reading x: disk on fire");
    }
}
