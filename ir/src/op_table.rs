//! `op_table!`: the IR's ops declared once, one row per [`crate::Op`] variant.
//!
//! A row is the variant (with its fields and their docs), its plan opcode
//! (`kiln_isa::opcode`, the instruction set's own table), how the text form
//! spells it, and its flags:
//!
//! ```text
//! /// doc of the variant
//! [Variant { field: Type, .. }] opcode PlanOpcode, text("name"), flags..;
//! ```
//!
//! - `opcode X` names the plan opcode the op lowers to (`opcode none`: a
//!   loop, which lowers to several instructions); operand counts come from it.
//! - The text spelling is one of
//!   - `text("name")`: one name; every field is an attribute, in field order;
//!   - `select(A => "a", B => "b")`: the first field (a leaf enum) picks the
//!     name (`reduce_sum`, `max_pool`); the other fields are attributes;
//!   - `leaf()`: a tuple variant over a leaf enum (`Unary(UnaryOp)`), spelt
//!     as the leaf's own name, no attributes;
//!   - `custom(pattern => "name" ["key", ..], ..)`: names by pattern, keys
//!     listed; the attribute values are parsed and printed by hand
//!     (`text/ops.rs`, `parse_custom` / `format_custom`) because their text
//!     is not one attribute per field (a distribution's parameters, a
//!     reduction printed even when absent, keys present only together).
//! - Flags: `composite` (built from primitives: decomposition may rewrite
//!   it), `effect` (run for an effect, kept by dead-code elimination),
//!   `layout_only` (a pure rearrangement of its input's elements),
//!   `channels_first` (its operands are `N, C, spatial..`: the one layout
//!   convention the IR has; a target description's `layout` is checked
//!   against it).
//!
//! From the rows come the `Op` enum, `name`, `plan_opcode`, `has_effect`,
//! `is_layout_only`, `is_channels_first`, `OpKind` (the op without its
//! parameters, with `OpKind::of` and `is_composite`),
//! [`crate::op::text_forms`] (every text name with its attribute keys) and
//! the text form's per-op parsing and printing, through one codec per field
//! type (`text/ops.rs`: `AttrValue`, `AttrField`). Shape inference and
//! lowering's parameter conversion stay hand-written, one arm per op.

macro_rules! op_table {
    ( $( $(#[$meta:meta])* [ $variant:ident $( $shape:tt )? ] opcode $opcode:ident, $tkind:ident $targs:tt
         $( , $flag:ident )* ; )* ) => {
        /// The closed set of operations, declared by the op table (`op.rs`).
        #[derive(Clone, Debug, PartialEq)]
        pub enum Op {
            $( $(#[$meta])* $variant $( $shape )?, )*
        }

        impl Op {
            /// The text-form name of the op (`add`, `matmul`, `reduce_sum`, ...).
            pub fn name(&self) -> &'static str {
                match self {
                    $( Op::$variant { .. } => op_row!(name, self, $variant, $tkind $targs, [$( $shape )?]), )*
                }
            }

            /// The plan opcode this op lowers to (`kiln_isa::opcode`, the one table of
            /// the instruction set), or `None` for a loop, which lowers to several
            /// instructions.
            pub fn plan_opcode(&self) -> Option<Opcode> {
                match self {
                    $( Op::$variant { .. } => op_row!(opcode $opcode), )*
                }
            }

            /// Ops run for an effect other than their results (binding a symbol, a
            /// run-time check): dead-code elimination keeps them.
            pub fn has_effect(&self) -> bool {
                match self {
                    $( Op::$variant { .. } => op_row!(flag effect; $( $flag )*), )*
                }
            }

            /// Ops whose output is a pure rearrangement of their input's elements.
            pub fn is_layout_only(&self) -> bool {
                match self {
                    $( Op::$variant { .. } => op_row!(flag layout_only; $( $flag )*), )*
                }
            }

            /// Ops whose operands follow the `N, C, spatial..` convention
            /// (convolution, pooling, batch norm, resizing): their meaning
            /// depends on the memory layout, every other op's does not.
            pub fn is_channels_first(&self) -> bool {
                match self {
                    $( Op::$variant { .. } => op_row!(flag channels_first; $( $flag )*), )*
                }
            }

            /// The op called `name`, its attributes taken from `a`; `None` for a
            /// name the generated rows do not spell (a `custom` row's, or unknown).
            pub(crate) fn parse_text(
                name: &str,
                a: &mut crate::text::Attrs,
                symbols: &crate::PrimaryMap<crate::SymbolId, crate::Symbol>,
            ) -> Result<Option<Op>, crate::text::ParseError> {
                $( op_row!(parse, name, a, symbols, $variant, $tkind $targs, [$( $shape )?]); )*
                Ok(None)
            }

            /// The attributes of the op in canonical order, as `key=value` texts;
            /// `None` for a `custom` row.
            pub(crate) fn format_text(
                &self,
                symbols: &crate::PrimaryMap<crate::SymbolId, crate::Symbol>,
            ) -> Option<Vec<String>> {
                match self {
                    $( Op::$variant { .. } => op_row!(format, self, symbols, $variant, $tkind $targs, [$( $shape )?]), )*
                }
            }
        }

        impl OpKind {
            /// Ops built from primitives, which decomposition can rewrite into
            /// them (when its rule applies to the node's sizes and dtypes); a
            /// target keeps those its kernels run whole.
            pub fn is_composite(self) -> bool {
                match self {
                    $( OpKind::$variant { .. } => op_row!(flag composite; $( $flag )*), )*
                }
            }
        }

        op_kind! { [] [] $( [$variant [$( $shape )?] $tkind] )* }

        /// Every text-form name of an op with the attribute keys it accepts, in
        /// canonical order (optional ones included), from the op table.
        pub fn text_forms() -> Vec<(&'static str, Vec<&'static str>)> {
            let mut forms = Vec::new();
            $( op_row!(forms, forms, $variant, $tkind $targs, [$( $shape )?]); )*
            forms
        }
    };
}

/// One column of one row of [`op_table!`], expanded for one generated function.
macro_rules! op_row {
    // The plan opcode.
    (opcode none) => { None };
    (opcode $opcode:ident) => { Some(Opcode::$opcode) };

    // A flag: whether `$want` is among the row's flags.
    (flag $want:ident; ) => { false };
    (flag effect; effect $( $rest:ident )*) => { true };
    (flag layout_only; layout_only $( $rest:ident )*) => { true };
    (flag channels_first; channels_first $( $rest:ident )*) => { true };
    (flag composite; composite $( $rest:ident )*) => { true };
    (flag $want:ident; $other:ident $( $rest:ident )*) => { op_row!(flag $want; $( $rest )*) };

    // `name`.
    (name, $self:ident, $variant:ident, text($name:literal), $shape:tt) => { $name };
    (name, $self:ident, $variant:ident, select($( $value:ident => $name:literal ),+ $(,)?),
        [{ $(#[$smeta:meta])* $sel:ident : $selty:ident $(, $( $rest:tt )* )? }]) => {
        // The outer arm matched this variant; the `match` is exhaustive over the selector.
        if let Op::$variant { $sel, .. } = $self { match $sel { $( $selty::$value => $name, )+ } } else { "" }
    };
    (name, $self:ident, $variant:ident, leaf(), $shape:tt) => {
        if let Op::$variant(leaf) = $self { leaf.name() } else { "" }
    };
    (name, $self:ident, $variant:ident, custom($( $pat:pat => $name:literal [$( $key:literal ),*] ),+ $(,)?), $shape:tt) => {
        match $self { $( $pat => $name, )+ _ => "" }
    };

    // `parse_text`: returns the op when `$n` is one of the row's names.
    (parse, $n:ident, $a:ident, $s:ident, $variant:ident, text($name:literal), []) => {
        if $n == $name {
            return Ok(Some(Op::$variant));
        }
    };
    (parse, $n:ident, $a:ident, $s:ident, $variant:ident, text($name:literal),
        [{ $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* $(,)? }]) => {
        if $n == $name {
            return Ok(Some(Op::$variant { $( $field: crate::text::take_attr::<$fty>($a, stringify!($field), $n, $s)?, )* }));
        }
    };
    (parse, $n:ident, $a:ident, $s:ident, $variant:ident, select($( $value:ident => $name:literal ),+ $(,)?),
        [$fields:tt]) => {
        $( op_row!(parse_selected, $n, $a, $s, $variant, $value, $name, $fields); )+
    };
    (parse_selected, $n:ident, $a:ident, $s:ident, $variant:ident, $value:ident, $name:literal,
        { $(#[$smeta:meta])* $sel:ident : $selty:ident $(, $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* )? $(,)? }) => {
        if $n == $name {
            return Ok(Some(Op::$variant {
                $sel: $selty::$value,
                $( $( $field: crate::text::take_attr::<$fty>($a, stringify!($field), $n, $s)?, )* )?
            }));
        }
    };
    (parse, $n:ident, $a:ident, $s:ident, $variant:ident, leaf(), [( $leaf:ident )]) => {
        if let Some(leaf) = $leaf::from_name($n) {
            return Ok(Some(Op::$variant(leaf)));
        }
    };
    (parse, $n:ident, $a:ident, $s:ident, $variant:ident, custom $args:tt, $shape:tt) => {};

    // `format_text`.
    (format, $self:ident, $s:ident, $variant:ident, text($name:literal), []) => { Some(Vec::new()) };
    (format, $self:ident, $s:ident, $variant:ident, leaf(), $shape:tt) => { Some(Vec::new()) };
    (format, $self:ident, $s:ident, $variant:ident, text($name:literal),
        [{ $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* $(,)? }]) => {{
        let mut out = Vec::new();
        if let Op::$variant { $( $field, )* } = $self {
            $( crate::text::put_attr::<$fty>($field, stringify!($field), &mut out, $s); )*
        }
        Some(out)
    }};
    (format, $self:ident, $s:ident, $variant:ident, select $args:tt,
        [{ $(#[$smeta:meta])* $sel:ident : $selty:ident $(, $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* )? $(,)? }]) => {{
        let mut out = Vec::new();
        if let Op::$variant { $( $( $field, )* )? .. } = $self {
            $( $( crate::text::put_attr::<$fty>($field, stringify!($field), &mut out, $s); )* )?
        }
        Some(out)
    }};
    (format, $self:ident, $s:ident, $variant:ident, custom $args:tt, $shape:tt) => { None };

    // `text_forms`.
    (forms, $v:ident, $variant:ident, text($name:literal), []) => { $v.push(($name, Vec::new())); };
    (forms, $v:ident, $variant:ident, text($name:literal),
        [{ $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* $(,)? }]) => {
        let keys: Vec<Vec<&'static str>> = vec![$( crate::text::attr_keys::<$fty>(stringify!($field)), )*];
        $v.push(($name, keys.concat()));
    };
    (forms, $v:ident, $variant:ident, select($( $value:ident => $name:literal ),+ $(,)?),
        [{ $(#[$smeta:meta])* $sel:ident : $selty:ident $(, $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* )? $(,)? }]) => {
        let keys: Vec<Vec<&'static str>> = vec![$( $( crate::text::attr_keys::<$fty>(stringify!($field)), )* )?];
        $( $v.push(($name, keys.concat())); )+
    };
    (forms, $v:ident, $variant:ident, leaf(), [( $leaf:ident )]) => {
        $v.extend($leaf::ALL.iter().map(|leaf| (leaf.name(), Vec::new())));
    };
    (forms, $v:ident, $variant:ident, custom($( $pat:pat => $name:literal [$( $key:literal ),*] ),+ $(,)?), $shape:tt) => {
        $( $v.push(($name, vec![$( $key ),*])); )+
    };
}

/// [`crate::OpKind`] from the rows of [`op_table!`], one at a time: its
/// variants and `OpKind::of`'s arms are collected, then declared.
macro_rules! op_kind {
    // A `leaf()` row: the leaf enum tells ops apart.
    ([$( $variants:tt )*] [$( $arms:tt )*] [$variant:ident [( $leaf:ident )] leaf] $( $rest:tt )*) => {
        op_kind! {
            [$( $variants )* $variant($leaf),]
            [$( $arms )* Op::$variant(leaf) => OpKind::$variant(*leaf),]
            $( $rest )*
        }
    };
    // A `select` row: so does the selecting field.
    ([$( $variants:tt )*] [$( $arms:tt )*]
        [$variant:ident [{ $(#[$smeta:meta])* $sel:ident : $selty:ident $(, $( $fields:tt )* )? }] select] $( $rest:tt )*) => {
        op_kind! {
            [$( $variants )* $variant($selty),]
            [$( $arms )* Op::$variant { $sel, .. } => OpKind::$variant(*$sel),]
            $( $rest )*
        }
    };
    ([$( $variants:tt )*] [$( $arms:tt )*] [$variant:ident $shape:tt $tkind:ident] $( $rest:tt )*) => {
        op_kind! {
            [$( $variants )* $variant,]
            [$( $arms )* Op::$variant { .. } => OpKind::$variant,]
            $( $rest )*
        }
    };
    ([$( $variants:tt )*] [$( $arms:tt )*]) => {
        /// An op without its parameters: the key of a target's capability
        /// tables. The selectors that pick a different function (which
        /// unary, binary, reduction, pooling or resize) are part of it;
        /// sizes, axes and other modes are not. From the op table.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        pub enum OpKind {
            $( $variants )*
        }

        impl OpKind {
            pub fn of(op: &Op) -> OpKind {
                match op {
                    $( $arms )*
                }
            }
        }
    };
}
