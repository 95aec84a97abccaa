//! A table's keys, each declared once: its name, what it is when absent (required, or its
//! default), how its value is read and checked, how it shows in the effective configuration,
//! and whether it takes effect only at start. The [`table!`] macro turns a list of such
//! declarations into the public struct, its default constants, the list of known keys, the
//! reading pass, the rendering, and which changed keys a reload cannot apply.
//!
//! Why a declaration rather than code per key: a key used to be written in nine places (the
//! known-key list, the read, the default, the struct field and its default constant, the
//! effective view's field and its line), and a key read only at start in a tenth (the reload's
//! hand list, which had missed five). Forgetting one compiled; now there is one place, and
//! `src/declared_tests.rs` checks that each key is in the effective config and in the docs, with
//! the default the docs state, and marked "Read at start" there exactly when declared so.
//!
//! Checks between keys (a certificate needs its key, two listeners must differ) are not
//! declarations: they stay plain code after the reads (`validate`), where they read best.

use std::marker::PhantomData;
use std::time::Duration;

use figment::value::{Dict, Value};

use crate::raw::{KeyPath, Reader};
use crate::show::{Show, Shown};

/// How a key's value is read and checked: `None` after recording an issue.
type ReadFn<T> = Box<dyn Fn(&mut Reader<'_>, &KeyPath, &Value) -> Option<T>>;
/// How a key's value shows in the effective configuration (`None`: left out).
type ShowFn<T> = for<'a> fn(&'a T) -> Option<Shown<'a>>;

/// What one declaration gives: one key ([`Key`]), or several that make one value (a
/// certificate and its key; a flattened table, [`Flat`]).
pub(crate) trait Declared<T> {
    /// Appends the keys' names, in the order the effective configuration writes them.
    fn names(&self, names: &mut Vec<&'static str>);
    /// Reads the keys from `table` (at `path`): the default for an absent key, `None` when a key
    /// is wrong or a required one is missing (reported).
    fn read(&self, r: &mut Reader<'_>, table: &Dict, path: &KeyPath) -> Option<T>;
    /// Appends the keys' lines for the effective configuration.
    fn show<'a>(&self, value: &'a T, shown: &mut Vec<(&'static str, Shown<'a>)>);
    /// Appends what leaving the keys unset means, for the effective configuration's leading
    /// comment (most keys have nothing to say).
    fn unset(&self, _value: &T, _notes: &mut Vec<&'static str>) {}
    /// Appends the names of the keys that take effect only at start: a reload that changes
    /// them is reported ([`Declared::restart_required`]). Most keys are read live.
    fn at_start(&self, _names: &mut Vec<&'static str>) {}
    /// Appends the name of each key read only at start whose value differs between `old` and
    /// `new`.
    fn restart_required(&self, _old: &T, _new: &T, _changed: &mut Vec<&'static str>) {}
}

/// One key.
pub(crate) struct Key<T> {
    name: &'static str,
    absent: Absent<T>,
    read: ReadFn<T>,
    show: ShowFn<T>,
    unset: Option<&'static str>,
    /// Taken only at start (a long-lived structure is built from it): a reload that changes it
    /// is reported, not applied.
    at_start: bool,
}

enum Absent<T> {
    /// Missing is an issue; the hint says what to write.
    Required(&'static str),
    /// The value an absent key stands for.
    Default(T),
}

/// A key whose default is still to be given: [`Defaulted::or`] (the `default CONST = value`
/// clause of [`table!`] calls it). Not a [`Declared`], so a forgotten default does not compile.
pub(crate) struct Defaulted<T> {
    name: &'static str,
    read: ReadFn<T>,
    show: ShowFn<T>,
    at_start: bool,
}

impl<T> Defaulted<T> {
    /// The key, with `default` standing for it when absent.
    pub(crate) fn or(self, default: T) -> Key<T> {
        Key {
            name: self.name,
            absent: Absent::Default(default),
            read: self.read,
            show: self.show,
            unset: None,
            at_start: self.at_start,
        }
    }

    /// Shows the value another way than its type does.
    pub(crate) fn show(mut self, show: ShowFn<T>) -> Self {
        self.show = show;
        self
    }

    /// The key takes effect only at start ([`Key::read_at_start`]).
    pub(crate) fn read_at_start(mut self) -> Self {
        self.at_start = true;
        self
    }
}

impl<T> Key<T> {
    /// Shows the value another way than its type does.
    pub(crate) fn show(mut self, show: ShowFn<T>) -> Self {
        self.show = show;
        self
    }

    /// Lists the key in the effective configuration's leading comment when it shows as nothing,
    /// with `note` (the key's path and what its absence means).
    pub(crate) fn unset(mut self, note: &'static str) -> Self {
        self.unset = Some(note);
        self
    }

    /// The key takes effect only at start: the gateway builds something long-lived from it
    /// (a listener, a pool, an index), so a reload that changes it is reported in its
    /// `restart_required` rather than applied. `docs/configuration.md` says "Read at start" on
    /// its row (`src/declared_tests.rs` checks both ways).
    pub(crate) fn read_at_start(mut self) -> Self {
        self.at_start = true;
        self
    }
}

// ===== the kinds of key =====

/// A key that must be present; `hint` says what to write (`missing (HINT)`).
pub(crate) fn required<T: Show + 'static>(
    name: &'static str,
    hint: &'static str,
    read: impl Fn(&mut Reader<'_>, &KeyPath, &Value) -> Option<T> + 'static,
) -> Key<T> {
    Key {
        name,
        absent: Absent::Required(hint),
        read: Box::new(read),
        show: T::show,
        unset: None,
        at_start: false,
    }
}

/// An optional key without a default: `None` when absent, left out of the effective
/// configuration then.
pub(crate) fn optional<T: 'static>(
    name: &'static str,
    read: impl Fn(&mut Reader<'_>, &KeyPath, &Value) -> Option<T> + 'static,
) -> Key<Option<T>>
where
    Option<T>: Show,
{
    Key {
        name,
        absent: Absent::Default(None),
        read: Box::new(move |r, p, v| read(r, p, v).map(Some)),
        show: Option::<T>::show,
        unset: None,
        at_start: false,
    }
}

/// A list that is empty when absent.
pub(crate) fn list<T: 'static>(
    name: &'static str,
    read: impl Fn(&mut Reader<'_>, &KeyPath, &Value) -> Option<Vec<T>> + 'static,
) -> Key<Vec<T>>
where
    Vec<T>: Show,
{
    Key {
        name,
        absent: Absent::Default(Vec::new()),
        read: Box::new(read),
        show: Vec::<T>::show,
        unset: None,
        at_start: false,
    }
}

/// A key with a default, read by `read`.
pub(crate) fn defaulted<T: Show + 'static>(
    name: &'static str,
    read: impl Fn(&mut Reader<'_>, &KeyPath, &Value) -> Option<T> + 'static,
) -> Defaulted<T> {
    Defaulted {
        name,
        read: Box::new(read),
        show: T::show,
        at_start: false,
    }
}

/// A whole number of at least `min`.
pub(crate) fn count(name: &'static str, min: usize) -> Defaulted<usize> {
    defaulted(name, move |r, p, v| r.count(p, v, min))
}

/// A duration above zero.
pub(crate) fn duration(name: &'static str) -> Defaulted<Duration> {
    defaulted(name, |r, p, v| r.duration(p, v, false))
}

/// A duration that may be zero (where zero means something: "at once").
pub(crate) fn duration_or_zero(name: &'static str) -> Defaulted<Duration> {
    defaulted(name, |r, p, v| r.duration(p, v, true))
}

/// `true` or `false`.
pub(crate) fn boolean(name: &'static str) -> Defaulted<bool> {
    defaulted(name, read_boolean)
}

/// [`Reader::boolean`] as a plain function: a method of `Reader<'f>` reads for one `'f` only,
/// and a declaration's reader must take any reader.
fn read_boolean(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<bool> {
    r.boolean(path, value)
}

impl<T: Clone + PartialEq> Declared<T> for Key<T> {
    fn names(&self, names: &mut Vec<&'static str>) {
        names.push(self.name);
    }

    fn read(&self, r: &mut Reader<'_>, table: &Dict, path: &KeyPath) -> Option<T> {
        let path = path.key(self.name);
        match (table.get(self.name), &self.absent) {
            (Some(value), _) => (self.read)(r, &path, value),
            (None, Absent::Default(default)) => Some(default.clone()),
            (None, Absent::Required(hint)) => {
                r.missing(&path, hint);
                None
            }
        }
    }

    fn show<'a>(&self, value: &'a T, shown: &mut Vec<(&'static str, Shown<'a>)>) {
        if let Some(value) = (self.show)(value) {
            shown.push((self.name, value));
        }
    }

    fn unset(&self, value: &T, notes: &mut Vec<&'static str>) {
        if let Some(note) = self.unset
            && (self.show)(value).is_none()
        {
            notes.push(note);
        }
    }

    fn at_start(&self, names: &mut Vec<&'static str>) {
        if self.at_start {
            names.push(self.name);
        }
    }

    fn restart_required(&self, old: &T, new: &T, changed: &mut Vec<&'static str>) {
        if self.at_start && old != new {
            changed.push(self.name);
        }
    }
}

/// The keys of a struct declared with [`table!`] written inline in another table, as
/// `[server]` holds the keys of [`CacheAffinity`](crate::CacheAffinity).
pub(crate) struct Flat<T>(PhantomData<T>);

impl<T> Flat<T> {
    pub(crate) fn new() -> Self {
        Flat(PhantomData)
    }
}

// ===== reading helpers, also for keys read by hand =====

/// Reads a key that must be present.
pub(crate) fn read_required<'f, 'v, T>(
    r: &mut Reader<'f>,
    table: &'v Dict,
    path: &KeyPath,
    key: &str,
    hint: &str,
    read: impl FnOnce(&mut Reader<'f>, &KeyPath, &'v Value) -> Option<T>,
) -> Option<T> {
    let path = path.key(key);
    let Some(value) = table.get(key) else {
        r.missing(&path, hint);
        return None;
    };
    read(r, &path, value)
}

/// Reads a key that may be absent: `Some(default)` then, `None` when present but wrong.
pub(crate) fn read_optional<'f, 'v, T>(
    r: &mut Reader<'f>,
    table: &'v Dict,
    path: &KeyPath,
    key: &str,
    default: T,
    read: impl FnOnce(&mut Reader<'f>, &KeyPath, &'v Value) -> Option<T>,
) -> Option<T> {
    match table.get(key) {
        Some(value) => read(r, &path.key(key), value),
        None => Some(default),
    }
}

// ===== the table macro =====

/// Declares a table: the public struct with one field per declaration, and `$keys`, each
/// field as read (`None`: wrong, reported), with
///
/// - `$keys::names()`: the known keys, in declaration order (an unknown key's message lists
///   them so);
/// - `$keys::read(r, table, path)`: every declaration read, in declaration order;
/// - `$keys::build(self)`: the struct, when every key was right;
/// - `$keys::show(&value)` and `$keys::unset(&value)`: the effective configuration's lines
///   and leading notes;
/// - `$keys::at_start()` and `$keys::restart_required(&old, &new, &mut changed)`: the keys
///   read only at start ([`Key::read_at_start`]), and those of them that differ;
/// - `Flat<$name>` as a [`Declared`], to write the table's keys inside another one.
///
/// Each entry is `FIELD: TYPE = DECLARATION;` or, for a default that is a public constant of
/// the struct, `FIELD: TYPE = DECLARATION, default CONST = VALUE;` (the declaration is then a
/// [`Defaulted`], which gets the constant).
macro_rules! table {
    (
        $(#[$meta:meta])*
        pub struct $name:ident, read as $keys:ident {
            $(
                $(#[$doc:meta])*
                $field:ident: $ty:ty = $declare:expr
                $(, default $(#[$cdoc:meta])* $const:ident = $value:expr)?;
            )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl $name {
            $($(
                #[doc = concat!("Default [`", stringify!($name), "::", stringify!($field), "`].")]
                $(#[$cdoc])*
                pub const $const: $ty = $value;
            )?)*
        }

        #[doc = concat!("Each key of [`", stringify!($name), "`] as read: `None` when wrong (reported).")]
        pub(crate) struct $keys {
            $(pub(crate) $field: Option<$ty>,)*
        }

        impl $keys {
            $(
                fn $field() -> impl $crate::key::Declared<$ty> {
                    $declare $(.or($name::$const))?
                }
            )*

            pub(crate) fn names() -> Vec<&'static str> {
                let mut names = Vec::new();
                $($crate::key::Declared::names(&Self::$field(), &mut names);)*
                names
            }

            pub(crate) fn read(
                r: &mut $crate::raw::Reader<'_>,
                table: &figment::value::Dict,
                path: &$crate::raw::KeyPath,
            ) -> Self {
                // A struct literal evaluates in the order written: keys are read (and their
                // issues recorded) in declaration order.
                $keys {
                    $($field: $crate::key::Declared::read(&Self::$field(), r, table, path),)*
                }
            }

            pub(crate) fn build(self) -> Option<$name> {
                Some($name {
                    $($field: self.$field?,)*
                })
            }

            pub(crate) fn show<'a>(
                value: &'a $name,
                shown: &mut Vec<(&'static str, $crate::show::Shown<'a>)>,
            ) {
                $($crate::key::Declared::show(&Self::$field(), &value.$field, shown);)*
            }

            pub(crate) fn unset(value: &$name, notes: &mut Vec<&'static str>) {
                $($crate::key::Declared::unset(&Self::$field(), &value.$field, notes);)*
            }

            #[allow(dead_code, reason = "a table without keys read at start never asks")]
            pub(crate) fn at_start() -> Vec<&'static str> {
                let mut names = Vec::new();
                $($crate::key::Declared::at_start(&Self::$field(), &mut names);)*
                names
            }

            #[allow(dead_code, reason = "a table without keys read at start never asks")]
            pub(crate) fn restart_required(
                old: &$name,
                new: &$name,
                changed: &mut Vec<&'static str>,
            ) {
                $($crate::key::Declared::restart_required(
                    &Self::$field(),
                    &old.$field,
                    &new.$field,
                    changed,
                );)*
            }
        }

        impl $crate::key::Declared<$name> for $crate::key::Flat<$name> {
            fn names(&self, names: &mut Vec<&'static str>) {
                names.extend($keys::names());
            }

            fn read(
                &self,
                r: &mut $crate::raw::Reader<'_>,
                table: &figment::value::Dict,
                path: &$crate::raw::KeyPath,
            ) -> Option<$name> {
                $keys::read(r, table, path).build()
            }

            fn show<'a>(
                &self,
                value: &'a $name,
                shown: &mut Vec<(&'static str, $crate::show::Shown<'a>)>,
            ) {
                $keys::show(value, shown);
            }

            fn unset(&self, value: &$name, notes: &mut Vec<&'static str>) {
                $keys::unset(value, notes);
            }

            fn at_start(&self, names: &mut Vec<&'static str>) {
                names.extend($keys::at_start());
            }

            fn restart_required(
                &self,
                old: &$name,
                new: &$name,
                changed: &mut Vec<&'static str>,
            ) {
                $keys::restart_required(old, new, changed);
            }
        }
    };
}

pub(crate) use table;
