//! The Lua script that keeps one key's holders and waiters in Redis, the names of the key's
//! data, and the typed calls into it.
//!
//! One script serves every operation (`acquire`, `release`, `configure`, `renew`), so that they
//! all share one prelude (limits, expiry, fill) and one reply shape. Each call is atomic in
//! Redis and is one round trip (`EVALSHA`; `EVAL` once after Redis lost its script cache).
//! The layout and the reasoning are in `docs/scale-out.md`.

use std::sync::LazyLock;

use redis::Script;

/// The Lua source. KEYS: limits, holders, waiters, wexp, seq, gone. ARGV: channel, the caller's
/// parallel and queue (written only if the key has no limits yet), the operation, its
/// arguments.
const SOURCE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local KEEP = 86400000

-- A lease id ends in its own lease length: '<replica>/<n>/<ttl ms>'.
local function ttl_of(id)
  return tonumber(string.match(id, '/(%d+)$')) or 10000
end

local function limits()
  local l = redis.call('HMGET', KEYS[1], 'parallel', 'queue')
  if not l[1] or not l[2] then
    redis.call('HSET', KEYS[1], 'parallel', ARGV[2], 'queue', ARGV[3])
    return tonumber(ARGV[2]), tonumber(ARGV[3])
  end
  return tonumber(l[1]), tonumber(l[2])
end

local function expire()
  local n = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('ZREM', KEYS[3], id)
  end
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  return n + #dead
end

-- Direct handoff: free slots go to the head waiters, in arrival order.
local function fill(parallel)
  local granted = {}
  while redis.call('ZCARD', KEYS[2]) < parallel do
    local head = redis.call('ZPOPMIN', KEYS[3])
    if #head == 0 then break end
    local id = head[1]
    redis.call('ZREM', KEYS[4], id)
    redis.call('ZADD', KEYS[2], now + ttl_of(id), id)
    granted[#granted + 1] = id
  end
  if #granted > 0 then
    redis.call('PUBLISH', ARGV[1], table.concat(granted, ' '))
  end
  return granted
end

local op = ARGV[4]
local status = 0
local reported = {}
local restored = 0

if op == 'configure' then
  redis.call('HSET', KEYS[1], 'parallel', ARGV[5], 'queue', ARGV[6])
elseif op == 'release' then
  local id = ARGV[5]
  status = redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZADD', KEYS[6], now + 2 * ttl_of(id), id)
elseif op == 'renew' then
  -- Renewals first: a replica that renews late, but renews, keeps its slots.
  for i = 5, #ARGV, 2 do
    local id, kind = ARGV[i], ARGV[i + 1]
    local exp = now + ttl_of(id)
    if redis.call('ZSCORE', KEYS[6], id) then
      -- released meanwhile: never resurrect it
    elseif redis.call('ZSCORE', KEYS[2], id) then
      redis.call('ZADD', KEYS[2], exp, id)
      if kind == 'w' then reported[#reported + 1] = id end
    elseif kind == 'h' then
      redis.call('ZADD', KEYS[2], exp, id)
      restored = restored + 1
    elseif redis.call('ZSCORE', KEYS[3], id) then
      redis.call('ZADD', KEYS[4], exp, id)
    else
      redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), id)
      redis.call('ZADD', KEYS[4], exp, id)
      restored = restored + 1
    end
  end
end

local parallel, queue = limits()
local expired = expire()
local granted = fill(parallel)

if op == 'acquire' then
  local id = ARGV[5]
  if redis.call('ZSCORE', KEYS[6], id) then
    status = 3
  elseif redis.call('ZSCORE', KEYS[2], id) then
    -- A retry of an acquire whose reply was lost: it holds already (one place, not two).
    redis.call('ZADD', KEYS[2], now + ttl_of(id), id)
    status = 1
  elseif redis.call('ZSCORE', KEYS[3], id) then
    -- A retry while it waits: keep its place in line.
    redis.call('ZADD', KEYS[4], now + ttl_of(id), id)
    status = 2
  elseif redis.call('ZCARD', KEYS[2]) < parallel then
    redis.call('ZADD', KEYS[2], now + ttl_of(id), id)
    status = 1
  elseif redis.call('ZCARD', KEYS[3]) >= queue then
    status = 0
  else
    redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[5]), id)
    redis.call('ZADD', KEYS[4], now + ttl_of(id), id)
    status = 2
  end
end

for i = 1, 6 do
  redis.call('PEXPIRE', KEYS[i], KEEP)
end
return {status, redis.call('ZCARD', KEYS[2]), redis.call('ZCARD', KEYS[3]), expired,
  granted, reported, restored}
";

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The largest `parallel` or `queue` written to Redis: Lua numbers are doubles, and anything
/// this large means "unlimited" anyway.
const LUA_MAX: usize = 1 << 53;

/// The Redis names of one (host, model) key: its six data keys and its wake-up channel.
#[derive(Debug, Clone)]
pub(crate) struct KeyNames {
    keys: [String; 6],
    channel: String,
}

impl KeyNames {
    /// The names for `host` and `model` under `prefix`. The host's length makes the pair
    /// unambiguous whatever the names contain; the braces are a Redis Cluster hash tag.
    pub(crate) fn new(prefix: &str, host: &str, model: &str) -> Self {
        let id = format!("{}:{host}|{model}", host.len());
        let base = format!("{prefix}:{{{id}}}");
        let keys = ["limits", "holders", "waiters", "wexp", "seq", "gone"]
            .map(|suffix| format!("{base}:{suffix}"));
        Self {
            keys,
            channel: format!("{prefix}:wake:{id}"),
        }
    }

    /// Every data key, for tests that clean up after themselves.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> &[String; 6] {
        &self.keys
    }

    /// The pattern that matches every key's wake-up channel under `prefix`.
    pub(crate) fn wake_pattern(prefix: &str) -> String {
        format!("{prefix}:wake:*")
    }
}

/// One operation of the script.
#[derive(Debug)]
pub(crate) enum Op<'a> {
    Acquire(&'a str),
    Release(&'a str),
    Configure {
        parallel: usize,
        queue: usize,
    },
    /// This replica's leases of the key: (id, is it held here).
    Renew(&'a [(String, bool)]),
}

/// What an acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Refused: the queue is full (or, for a release, the id was not a holder).
    No,
    /// Granted at once (or, for a release, the id was a holder).
    Yes,
    /// Joined the queue.
    Queued,
    /// The id was released before its acquire arrived: nothing was written.
    Gone,
}

/// The script's reply: the outcome and the key's state after the call.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: Status,
    /// Holders across every replica.
    pub(crate) holders: usize,
    /// Waiters across every replica.
    pub(crate) waiters: usize,
    /// Leases (holders and waiters) this call found expired and removed.
    pub(crate) expired: u64,
    /// Lease ids this call moved from the queue to the holders.
    pub(crate) granted: Vec<String>,
    /// `renew`: waiters of the caller found among the holders.
    pub(crate) reported: Vec<String>,
    /// `renew`: leases of the caller that Redis had lost and that were put back.
    pub(crate) restored: u64,
}

type RawReply = (i64, i64, i64, i64, Vec<String>, Vec<String>, i64);

impl Reply {
    fn from_raw(raw: RawReply) -> Self {
        let (status, holders, waiters, expired, granted, reported, restored) = raw;
        Self {
            status: match status {
                1 => Status::Yes,
                2 => Status::Queued,
                3 => Status::Gone,
                _ => Status::No,
            },
            holders: usize::try_from(holders).unwrap_or(0),
            waiters: usize::try_from(waiters).unwrap_or(0),
            expired: u64::try_from(expired).unwrap_or(0),
            granted,
            reported,
            restored: u64::try_from(restored).unwrap_or(0),
        }
    }
}

/// Runs `op` on the key named by `names`, writing `defaults` (parallel, queue) as its limits if
/// Redis has none for it.
pub(crate) async fn call<C>(
    conn: &mut C,
    names: &KeyNames,
    defaults: (usize, usize),
    op: &Op<'_>,
) -> redis::RedisResult<Reply>
where
    C: redis::aio::ConnectionLike,
{
    let mut invocation = SCRIPT.prepare_invoke();
    for key in &names.keys {
        invocation.key(key);
    }
    invocation
        .arg(&names.channel)
        .arg(defaults.0.min(LUA_MAX))
        .arg(defaults.1.min(LUA_MAX));
    match op {
        Op::Acquire(id) => {
            invocation.arg("acquire").arg(*id);
        }
        Op::Release(id) => {
            invocation.arg("release").arg(*id);
        }
        Op::Configure { parallel, queue } => {
            invocation
                .arg("configure")
                .arg((*parallel).min(LUA_MAX))
                .arg((*queue).min(LUA_MAX));
        }
        Op::Renew(leases) => {
            invocation.arg("renew");
            for (id, held) in *leases {
                invocation.arg(id).arg(if *held { "h" } else { "w" });
            }
        }
    }
    let raw: RawReply = invocation.invoke_async(conn).await?;
    Ok(Reply::from_raw(raw))
}
