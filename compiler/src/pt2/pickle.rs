//! A pickle reader for the `data.pkl` of a `torch.save` archive: the state
//! dict of a `.pt2` saved by torch 2.5 – 2.8.
//!
//! It never executes anything. It understands the protocol-2 opcodes that
//! `torch.save` emits and a short allow-list of globals (the tensor and
//! parameter rebuild functions, `collections.OrderedDict`, the typed storage
//! classes); any other global is an error naming it. Everything is bounded:
//! the stack, the memo, container nesting and the copies that the memo's
//! copy-on-write semantics can cause, so hostile bytes give an error, never a
//! panic or an unbounded allocation.
//!
//! The result is, for every entry of the top-level dict, the tensor's storage
//! (a key naming the member `data/<key>`, its element type and length) and its
//! view (sizes, strides, storage offset in elements).

use std::collections::HashMap;
use std::rc::Rc;

/// Bounds on what a state dict's pickle may ask of us. torch's own pickles
/// stay far below them (a 7B-parameter model has a few thousand entries).
const MAX_STACK: usize = 1 << 16;
const MAX_MEMO: usize = 1 << 20;
const MAX_DEPTH: u32 = 32;
/// Elements copied when a shared (memoised) container is modified.
const MAX_COPIED: usize = 1 << 22;
const MAX_RANK: usize = 64;

/// A pickle that could not be read, with the byte offset of the opcode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("pickle at byte {offset}: {detail}")]
pub struct PickleError {
    pub offset: usize,
    pub detail: String,
}

/// One tensor of the state dict.
#[derive(Clone, Debug, PartialEq)]
pub struct PickledTensor {
    pub storage: StorageRef,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub storage_offset: i64,
}

/// A storage named by a persistent id `('storage', torch.FloatStorage, key, location, numel)`.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageRef {
    pub key: String,
    pub class: StorageClass,
    /// Length in elements of [`StorageRef::class`].
    pub numel: u64,
}

/// The typed storage classes `torch.save` names (the legacy `torch.*Storage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageClass {
    Byte,
    Char,
    Short,
    Int,
    Long,
    Half,
    Float,
    Double,
    ComplexHalf,
    ComplexFloat,
    ComplexDouble,
    Bool,
    BFloat16,
}

impl StorageClass {
    fn from_name(name: &str) -> Option<StorageClass> {
        use StorageClass::*;
        Some(match name {
            "ByteStorage" => Byte,
            "CharStorage" => Char,
            "ShortStorage" => Short,
            "IntStorage" => Int,
            "LongStorage" => Long,
            "HalfStorage" => Half,
            "FloatStorage" => Float,
            "DoubleStorage" => Double,
            "ComplexHalfStorage" => ComplexHalf,
            "ComplexFloatStorage" => ComplexFloat,
            "ComplexDoubleStorage" => ComplexDouble,
            "BoolStorage" => Bool,
            "BFloat16Storage" => BFloat16,
            _ => return None,
        })
    }

    /// The export schema's ScalarType number (see [`super::scalar_type`]).
    pub fn scalar_type(self) -> i64 {
        use StorageClass::*;
        match self {
            Byte => 1,
            Char => 2,
            Short => 3,
            Int => 4,
            Long => 5,
            Half => 6,
            Float => 7,
            Double => 8,
            ComplexHalf => 9,
            ComplexFloat => 10,
            ComplexDouble => 11,
            Bool => 12,
            BFloat16 => 13,
        }
    }

    pub fn element_bytes(self) -> u64 {
        use StorageClass::*;
        match self {
            Byte | Char | Bool => 1,
            Short | Half | BFloat16 => 2,
            Int | Float | ComplexHalf => 4,
            Long | Double | ComplexFloat => 8,
            ComplexDouble => 16,
        }
    }
}

/// The globals a state dict may name; anything else is refused.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildParameter,
    RebuildParameterWithState,
    Storage(StorageClass),
}

impl Global {
    fn resolve(module: &str, name: &str) -> Option<Global> {
        match (module, name) {
            ("collections", "OrderedDict") => Some(Global::OrderedDict),
            ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensorV2),
            ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
            ("torch._utils", "_rebuild_parameter_with_state") => Some(Global::RebuildParameterWithState),
            ("torch", storage) => StorageClass::from_name(storage).map(Global::Storage),
            _ => None,
        }
    }
}

/// A pickled value. Containers are immutable once shared: the memo holds
/// `Rc`s and a modification copies (counted against [`MAX_COPIED`]), so no
/// cycle can form and nesting depth is exact.
#[derive(Clone, Debug)]
enum Value {
    None,
    /// Flags (`requires_grad`) and floats are accepted but never needed.
    Bool,
    Int(i64),
    Float,
    Str(Rc<str>),
    Tuple(Rc<Container>),
    List(Rc<Container>),
    Dict(Rc<DictValue>),
    Global(Global),
    Storage(Rc<StorageRef>),
    Tensor(Rc<PickledTensor>),
}

#[derive(Clone, Debug, Default)]
struct Container {
    items: Vec<Value>,
    depth: u32,
}

#[derive(Clone, Debug, Default)]
struct DictValue {
    items: Vec<(Value, Value)>,
    depth: u32,
}

impl Value {
    fn depth(&self) -> u32 {
        match self {
            Value::Tuple(c) | Value::List(c) => c.depth,
            Value::Dict(d) => d.depth,
            _ => 0,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool => "a bool",
            Value::Int(_) => "an int",
            Value::Float => "a float",
            Value::Str(_) => "a string",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
            Value::Global(_) => "a class or function",
            Value::Storage(_) => "a storage",
            Value::Tensor(_) => "a tensor",
        }
    }
}

/// Reads a state dict pickle: entry name → tensor, in pickle order.
pub fn read_state_dict(bytes: &[u8]) -> Result<Vec<(String, PickledTensor)>, PickleError> {
    let mut machine = Machine::new(bytes);
    let top = machine.run()?;
    // Shape errors are reported at the STOP opcode, where the value is complete.
    let offset = machine.op_start;
    let Value::Dict(dict) = top else {
        return Err(PickleError {
            offset,
            detail: format!("the pickle holds {}, expected a dict of tensors", top.kind()),
        });
    };
    dict.items
        .iter()
        .map(|(k, v)| match (k, v) {
            (Value::Str(name), Value::Tensor(t)) => Ok((name.to_string(), (**t).clone())),
            (Value::Str(name), other) => {
                Err(PickleError { offset, detail: format!("entry `{name}` is {}, expected a tensor", other.kind()) })
            }
            (other, _) => Err(PickleError { offset, detail: format!("a key is {}, expected a string", other.kind()) }),
        })
        .collect()
}

/// The unpickling state. `op_start` is where the current opcode began, for errors.
struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    op_start: usize,
    stack: Vec<Value>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    /// By slot number (a map: a 5-byte LONG_BINPUT must not size an allocation).
    memo: HashMap<u32, Value>,
    copied: usize,
}

type R<T> = Result<T, PickleError>;

impl<'a> Machine<'a> {
    fn new(bytes: &'a [u8]) -> Machine<'a> {
        Machine { bytes, pos: 0, op_start: 0, stack: Vec::new(), marks: Vec::new(), memo: HashMap::new(), copied: 0 }
    }

    fn fail<T>(&self, detail: impl Into<String>) -> R<T> {
        Err(PickleError { offset: self.op_start, detail: detail.into() })
    }

    fn take(&mut self, n: usize) -> R<&[u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return self.fail(format!("truncated: needs {n} more bytes, {} left", self.bytes.len() - self.pos));
        };
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> R<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> R<u32> {
        Ok(u32::from_le_bytes(self.le()?))
    }

    fn utf8(&mut self, n: usize) -> R<Rc<str>> {
        let raw = self.take(n)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(Rc::from(s)),
            Err(e) => self.fail(format!("string is not UTF-8: {e}")),
        }
    }

    /// A `\n`-terminated ASCII line (GLOBAL's operands).
    fn line(&mut self) -> R<String> {
        let rest = &self.bytes[self.pos..];
        let Some(len) = rest.iter().take(256).position(|&b| b == b'\n') else {
            return self.fail("GLOBAL name is not terminated by a newline within 256 bytes");
        };
        let text = String::from_utf8_lossy(&rest[..len]).into_owned();
        self.pos += len + 1;
        Ok(text)
    }

    fn push(&mut self, v: Value) -> R<()> {
        if self.stack.len() >= MAX_STACK {
            return self.fail(format!("stack deeper than {MAX_STACK} values"));
        }
        if v.depth() > MAX_DEPTH {
            return self.fail(format!("containers nested deeper than {MAX_DEPTH}"));
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> R<Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.fail("stack underflow");
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    /// The values pushed since the last MARK.
    fn pop_mark(&mut self) -> R<Vec<Value>> {
        let Some(mark) = self.marks.pop() else { return self.fail("no MARK on the stack") };
        Ok(self.stack.split_off(mark))
    }

    fn top_mut(&mut self) -> R<&mut Value> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.fail("stack underflow");
        }
        Ok(self.stack.last_mut().expect("checked above"))
    }

    fn tuple(&self, items: Vec<Value>) -> Value {
        let depth = 1 + items.iter().map(Value::depth).max().unwrap_or(0);
        Value::Tuple(Rc::new(Container { items, depth }))
    }

    fn memo_put(&mut self, slot: u32) -> R<()> {
        if self.memo.len() >= MAX_MEMO && !self.memo.contains_key(&slot) {
            return self.fail(format!("more than {MAX_MEMO} memoised values"));
        }
        let Some(top) = self.stack.last().cloned() else { return self.fail("PUT on an empty stack") };
        self.memo.insert(slot, top);
        Ok(())
    }

    fn memo_get(&mut self, slot: u32) -> R<()> {
        match self.memo.get(&slot).cloned() {
            Some(v) => self.push(v),
            None => self.fail(format!("GET of memo slot {slot}, which was never PUT")),
        }
    }

    /// Copy-on-write access to the dict or list on top of the stack; counts
    /// the elements copied when the memo shares it.
    fn extend_top(&mut self, items: Vec<Value>, pairs: bool) -> R<()> {
        let new_depth = 1 + items.iter().map(Value::depth).max().unwrap_or(0);
        if new_depth > MAX_DEPTH {
            return self.fail(format!("containers nested deeper than {MAX_DEPTH}"));
        }
        let op_start = self.op_start;
        let budget_left = MAX_COPIED.saturating_sub(self.copied);
        let top = self.top_mut()?;
        let (shared_len, what) = match (&*top, pairs) {
            (Value::Dict(d), true) => (if Rc::strong_count(d) > 1 { d.items.len() } else { 0 }, "dict"),
            (Value::List(l), false) => (if Rc::strong_count(l) > 1 { l.items.len() } else { 0 }, "list"),
            (other, true) => {
                let kind = other.kind();
                return Err(PickleError { offset: op_start, detail: format!("SETITEM(S) on {kind}, expected a dict") });
            }
            (other, false) => {
                let kind = other.kind();
                return Err(PickleError { offset: op_start, detail: format!("APPEND(S) on {kind}, expected a list") });
            }
        };
        if shared_len > budget_left {
            return Err(PickleError {
                offset: op_start,
                detail: format!("copies more than {MAX_COPIED} elements of shared {what}s"),
            });
        }
        match top {
            Value::Dict(d) => {
                let d = Rc::make_mut(d);
                let mut items = items.into_iter();
                while let (Some(k), Some(v)) = (items.next(), items.next()) {
                    d.items.push((k, v));
                }
                d.depth = d.depth.max(new_depth);
            }
            Value::List(l) => {
                let l = Rc::make_mut(l);
                l.items.extend(items);
                l.depth = l.depth.max(new_depth);
            }
            _ => unreachable!("matched above"),
        }
        self.copied += shared_len;
        Ok(())
    }

    fn run(&mut self) -> R<Value> {
        loop {
            self.op_start = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return self.fail(format!("pickle protocol {proto} is unknown"));
                    }
                }
                b'.' => {
                    let v = self.pop()?;
                    if !self.marks.is_empty() {
                        return self.fail("STOP inside an open MARK");
                    }
                    return Ok(v);
                }
                b'(' => {
                    if self.marks.len() >= MAX_STACK {
                        return self.fail("too many MARKs");
                    }
                    self.marks.push(self.stack.len());
                }
                b'N' => self.push(Value::None)?,
                0x88 | 0x89 => self.push(Value::Bool)?,
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.push(Value::Int(v as i64))?
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v as i64))?
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.push(Value::Int(v as i64))?
                }
                0x8a => {
                    let v = self.long1()?;
                    self.push(Value::Int(v))?
                }
                b'G' => {
                    self.take(8)?;
                    self.push(Value::Float)?
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    let s = self.utf8(n)?;
                    self.push(Value::Str(s))?
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let s = self.utf8(n)?;
                    self.push(Value::Str(s))?
                }
                b'}' => self.push(Value::Dict(Rc::default()))?,
                b']' => self.push(Value::List(Rc::default()))?,
                b')' => self.push(self.tuple(Vec::new()))?,
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(self.tuple(items))?
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = (0..n).map(|_| self.pop()).collect::<R<Vec<_>>>()?;
                    items.reverse();
                    self.push(self.tuple(items))?
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.extend_top(vec![k, v], true)?
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    if items.len() % 2 != 0 {
                        return self.fail("SETITEMS with an odd number of values");
                    }
                    self.extend_top(items, true)?
                }
                b'a' => {
                    let v = self.pop()?;
                    self.extend_top(vec![v], false)?
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.extend_top(items, false)?
                }
                b'q' => {
                    let slot = self.u8()?.into();
                    self.memo_put(slot)?
                }
                b'r' => {
                    let slot = self.u32()?;
                    self.memo_put(slot)?
                }
                // MEMOIZE (protocol 4): the next slot; the count is below MAX_MEMO.
                0x94 => self.memo_put(self.memo.len() as u32)?,
                b'h' => {
                    let slot = self.u8()?.into();
                    self.memo_get(slot)?
                }
                b'j' => {
                    let slot = self.u32()?;
                    self.memo_get(slot)?
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    match Global::resolve(&module, &name) {
                        Some(g) => self.push(Value::Global(g))?,
                        None => {
                            return self.fail(format!(
                                "refers to `{module}.{name}`, which kiln does not load (a state dict may only hold \
                                 plain tensors and parameters)"
                            ))
                        }
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let storage = self.persistent_storage(pid)?;
                    self.push(Value::Storage(Rc::new(storage)))?
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(callable, args)?;
                    self.push(v)?
                }
                b'b' => {
                    let state = self.pop()?;
                    self.build(state)?
                }
                other => return self.fail(format!("opcode 0x{other:02x} is not one torch.save writes")),
            }
        }
    }

    /// LONG1: a little-endian two's-complement integer of up to 8 bytes.
    fn long1(&mut self) -> R<i64> {
        let n = self.u8()? as usize;
        if n > 8 {
            return self.fail(format!("LONG1 of {n} bytes does not fit in 64 bits"));
        }
        let raw = self.take(n)?;
        let mut buf = if raw.last().is_some_and(|&b| b & 0x80 != 0) { [0xffu8; 8] } else { [0u8; 8] };
        buf[..n].copy_from_slice(raw);
        Ok(i64::from_le_bytes(buf))
    }

    /// `('storage', torch.FloatStorage, key, location, numel)`.
    fn persistent_storage(&self, pid: Value) -> R<StorageRef> {
        let Value::Tuple(t) = &pid else {
            return self.fail(format!("persistent id is {}, expected a tuple", pid.kind()));
        };
        match &t.items[..] {
            [Value::Str(tag), Value::Global(Global::Storage(class)), Value::Str(key), Value::Str(_location), Value::Int(numel)]
                if &**tag == "storage" =>
            {
                let plain =
                    !key.is_empty() && key.len() <= 64 && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !plain {
                    return self.fail(format!("storage key {key:?} is not a plain name"));
                }
                let Ok(numel) = u64::try_from(*numel) else {
                    return self.fail(format!("storage length {numel} is negative"));
                };
                Ok(StorageRef { key: key.to_string(), class: *class, numel })
            }
            _ => self.fail("persistent id is not ('storage', torch.<Type>Storage, key, location, numel)"),
        }
    }

    fn reduce(&self, callable: Value, args: Value) -> R<Value> {
        let Value::Global(g) = callable else {
            return self.fail(format!("REDUCE calls {}, expected an allowed global", callable.kind()));
        };
        let Value::Tuple(args) = args else {
            return self.fail(format!("REDUCE arguments are {}, expected a tuple", args.kind()));
        };
        let args = &args.items[..];
        match g {
            Global::OrderedDict if args.is_empty() => Ok(Value::Dict(Rc::default())),
            Global::OrderedDict => self.fail("collections.OrderedDict called with arguments"),
            // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
            Global::RebuildTensorV2 => match args {
                [Value::Storage(s), Value::Int(offset), size, stride, _requires_grad, _hooks, ..]
                    if args.len() <= 7 =>
                {
                    let sizes = self.int_tuple(size, "size")?;
                    let strides = self.int_tuple(stride, "stride")?;
                    if sizes.len() != strides.len() {
                        return self.fail(format!("{} sizes but {} strides", sizes.len(), strides.len()));
                    }
                    let storage = (**s).clone();
                    Ok(Value::Tensor(Rc::new(PickledTensor { storage, sizes, strides, storage_offset: *offset })))
                }
                _ => self
                    .fail("_rebuild_tensor_v2 arguments are not (storage, offset, size, stride, requires_grad, hooks)"),
            },
            // (data, requires_grad, backward_hooks[, state])
            Global::RebuildParameter | Global::RebuildParameterWithState => match args {
                [t @ Value::Tensor(_), _requires_grad, _hooks] => Ok(t.clone()),
                [t @ Value::Tensor(_), _requires_grad, _hooks, _state] if g == Global::RebuildParameterWithState => {
                    Ok(t.clone())
                }
                _ => self.fail("_rebuild_parameter arguments are not (tensor, requires_grad, hooks)"),
            },
            Global::Storage(_) => self.fail("a storage class is called; storages must come from persistent ids"),
        }
    }

    /// BUILD sets instance attributes. On a dict they never change its
    /// items (a `state_dict()` OrderedDict carries `_metadata` this way), so
    /// they are ignored; a tensor may only get empty state.
    fn build(&mut self, state: Value) -> R<()> {
        let empty = match &state {
            Value::None => true,
            Value::Dict(d) => d.items.is_empty(),
            Value::Tuple(t) => t.items.iter().all(|v| match v {
                Value::None => true,
                Value::Dict(d) => d.items.is_empty(),
                _ => false,
            }),
            _ => false,
        };
        let state_kind = state.kind();
        let target = self.top_mut()?;
        match target {
            Value::Dict(_) if matches!(state, Value::None | Value::Dict(_)) => Ok(()),
            Value::Tensor(_) if empty => Ok(()),
            other => {
                let kind = other.kind();
                self.fail(format!("BUILD of {kind} with {state_kind} state"))
            }
        }
    }

    fn int_tuple(&self, v: &Value, what: &str) -> R<Vec<i64>> {
        let Value::Tuple(t) = v else { return self.fail(format!("{what} is {}, expected a tuple of ints", v.kind())) };
        if t.items.len() > MAX_RANK {
            return self.fail(format!("{what} has {} dimensions (at most {MAX_RANK})", t.items.len()));
        }
        t.items
            .iter()
            .map(|x| match x {
                Value::Int(i) => Ok(*i),
                other => self.fail(format!("{what} holds {}, expected ints", other.kind())),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{'w': _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 6), 0, (2, 3), (3, 1), False, OrderedDict())}`
    fn one_tensor() -> Vec<u8> {
        let mut p = vec![0x80, 2, b'}', b'q', 0];
        p.extend(b"X\x01\x00\x00\x00w");
        p.extend(tensor_w());
        p.extend(b"s.");
        p
    }

    /// The `_rebuild_tensor_v2(...)` call of [`one_tensor`].
    fn tensor_w() -> Vec<u8> {
        let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n".to_vec();
        p.extend(b"((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQ");
        p.extend(b"K\x00K\x02K\x03\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)Rt");
        p.push(b'R');
        p
    }

    /// `model.state_dict()` is an OrderedDict whose `_metadata` attribute
    /// arrives by BUILD after the items.
    #[test]
    fn ordered_dict_with_metadata() {
        let mut p = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(X\x01\x00\x00\x00w".to_vec();
        p.extend(tensor_w());
        p.extend(b"u}X\x09\x00\x00\x00_metadatah\x00)Rsb.");
        let got = read_state_dict(&p).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "w");
        // State on a tensor is refused.
        let mut p = b"\x80\x02}(X\x01\x00\x00\x00w".to_vec();
        p.extend(tensor_w());
        p.extend(b"}X\x01\x00\x00\x00aK\x01sbu.");
        let e = read_state_dict(&p).unwrap_err();
        assert!(e.detail.contains("BUILD of a tensor"), "{e}");
    }

    #[test]
    fn reads_a_tensor_entry() {
        let got = read_state_dict(&one_tensor()).unwrap();
        assert_eq!(got.len(), 1);
        let (name, t) = &got[0];
        assert_eq!(name, "w");
        assert_eq!(t.sizes, vec![2, 3]);
        assert_eq!(t.strides, vec![3, 1]);
        assert_eq!(t.storage.key, "0");
        assert_eq!(t.storage.class, StorageClass::Float);
        assert_eq!(t.storage.numel, 6);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let full = one_tensor();
        for n in 0..full.len() {
            assert!(read_state_dict(&full[..n]).is_err(), "prefix of {n} bytes");
        }
    }

    /// Every byte replaced by every value: an error or a state dict, never a panic.
    #[test]
    fn every_single_byte_change_is_handled() {
        let original = one_tensor();
        for at in 0..original.len() {
            for value in 0..=255u8 {
                let mut p = original.clone();
                p[at] = value;
                let _ = read_state_dict(&p);
            }
        }
    }

    #[test]
    fn huge_lengths_are_refused_before_allocating() {
        // BINUNICODE claiming 4 GiB, LONG_BINPUT to slot 2³² - 1 then GET of a missing slot.
        let e = read_state_dict(b"\x80\x02X\xff\xff\xff\xff").unwrap_err();
        assert!(e.detail.contains("truncated"), "{e}");
        let e = read_state_dict(b"\x80\x02Nr\xff\xff\xff\xffj\xfe\xff\xff\xff.").unwrap_err();
        assert!(e.detail.contains("never PUT"), "{e}");
    }

    #[test]
    fn unknown_globals_are_named() {
        let p = b"\x80\x02cos\nsystem\n.".to_vec();
        let e = read_state_dict(&p).unwrap_err();
        assert!(e.detail.contains("os.system"), "{e}");
    }

    #[test]
    fn long1_is_sign_extended() {
        // LONG1 of 2 bytes: 0xffff is -1; 0xff7f (little-endian 0x7fff) is 32767.
        assert_eq!(Machine::new(b"\x02\xff\xff").long1().unwrap(), -1);
        assert_eq!(Machine::new(b"\x02\xff\x7f").long1().unwrap(), 32767);
        assert_eq!(Machine::new(b"\x00").long1().unwrap(), 0);
        assert!(Machine::new(b"\x09").long1().is_err());
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut p = vec![0x80, 2, b')'];
        p.extend(vec![0x85u8; 100]);
        p.push(b'.');
        let e = read_state_dict(&p).unwrap_err();
        assert!(e.detail.contains("nested"), "{e}");
    }
}
