//! Enumerations with two spellings: the Avro symbol (`HEALTHY`, what the wire and the schemas
//! carry) and the name people read (`healthy`, what JSON, the audit log and metric labels
//! carry). [`symbols!`] declares both from one list, with exhaustive conversions, so that no
//! copy of an enum can fall out of step with the contract or turn an unknown value into a
//! default.

/// `symbols! { Contract / View { Variant = "name", ... } }` declares the contract enum (serde
/// names are the Avro symbols) with `ALL`, `as_str` and `parse`, and its JSON view enum (serde
/// names are the readable names; an OpenAPI schema with the `openapi` feature).
macro_rules! symbols {
    ($(#[$meta:meta])* $name:ident / $(#[$vmeta:meta])* $view:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            /// Every value, in declaration (and Avro symbol) order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The readable name (JSON, audit log, metric labels).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// The value of a readable name (case-insensitive); None for anything else.
            pub fn parse(s: &str) -> Option<$name> {
                Self::ALL.into_iter().find(|v| v.as_str().eq_ignore_ascii_case(s))
            }

            /// The readable names, for error messages and documentation.
            pub fn names() -> Vec<&'static str> {
                Self::ALL.iter().map(|v| v.as_str()).collect()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        $(#[$vmeta])*
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $view {
            $($(#[$vdoc])* $variant),+
        }

        impl $view {
            /// The readable name.
            pub fn as_str(self) -> &'static str {
                $name::from(self).as_str()
            }
        }

        impl From<$name> for $view {
            fn from(v: $name) -> $view {
                match v {
                    $($name::$variant => $view::$variant),+
                }
            }
        }

        impl From<$view> for $name {
            fn from(v: $view) -> $name {
                match v {
                    $($view::$variant => $name::$variant),+
                }
            }
        }
    };
}

pub(crate) use symbols;
