//! `code_enum!`: a field-less enum with explicit `u16` codes and text names.

use std::fmt;

/// A numeric code that names no variant (from a newer or corrupt artifact).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UnknownCode {
    pub what: &'static str,
    pub code: u16,
}

impl fmt::Display for UnknownCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} code {}", self.what, self.code)
    }
}

impl std::error::Error for UnknownCode {}

/// Declares a `#[repr(u16)]` enum whose variants carry an explicit code and a
/// text name, with `ALL`, `code()`, `from_code()`, `name()`, `from_name()`,
/// `Display`, and (feature `serde`) serialization as the code.
macro_rules! code_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $code:literal => $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $code, )*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The stable numeric code stored in artifacts.
            pub const fn code(self) -> u16 {
                self as u16
            }

            pub fn from_code(code: u16) -> Result<$name, $crate::UnknownCode> {
                match code {
                    $( $code => Ok($name::$variant), )*
                    _ => Err($crate::UnknownCode { what: $what, code }),
                }
            }

            /// The name used by the IR's text form and in messages.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )*
                }
            }

            pub fn from_name(name: &str) -> Option<$name> {
                match name {
                    $( $text => Some($name::$variant), )*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        #[cfg(feature = "serde")]
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_u16(self.code())
            }
        }

        #[cfg(feature = "serde")]
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let code = <u16 as serde::Deserialize>::deserialize(d)?;
                $name::from_code(code).map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use code_enum;
