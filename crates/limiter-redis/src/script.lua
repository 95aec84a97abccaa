-- The shared limiter's one script: every operation on one host's keys, atomic in Redis.
--
-- KEYS: 1 state (the host's scheduler state, MessagePack), 2 holders (lease id -> expiry ms),
-- 3 held (lease id -> '<weight> <model>'), 4 gone (released lease ids -> when to forget them).
-- ARGV: 1 channel, 2 model, 3 parallel, 4 queue, 5 order ('fifo' | 'fair'), 6 host cap ('' for
-- none): the caller's configuration, written when the store has none (or, with 7, always);
-- 7 force ('k': write the model's limits and order, 'h': the host cap, 'kh': both), 8 the
-- operation, 9.. its arguments.
--
-- The grant step is a port of slotgate-limiter's general path (key.rs `fill`, group.rs `kick`,
-- sched.rs): weighted FIFO lists per priority class (per tenant and class under fair order),
-- deficit round-robin between the lists of a class, classes highest first with a starvation
-- bound, and a host cap shared by the host's models with a FIFO line of blocked models. The
-- crate's differential proptest runs the local limiter and this script side by side.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local KEEP = 86400000
local PASS_LIMIT = 4

local granted, refused, reported = {}, {}, {}
local restored, expired = 0, 0

-- A lease id ends in its own lease length: '<replica>/<n>/<ttl ms>'.
local function ttl_of(id)
  return tonumber(string.match(id, '/(%d+)$')) or 10000
end

local function new_key()
  local lists = {}
  for c = 1, 3 do
    lists[tostring(c)] = {c = c, sh = 1, cr = 0, ids = {}}
  end
  return {p = 1, q = 0, ord = 'fifo', inf = 0, n = 0, lists = lists, rings = {{}, {}, {}},
    vis = {false, false, false}, qd = {0, 0, 0}, pas = {0, 0, 0}, blocked = false}
end

local raw = redis.call('GET', KEYS[1])
local S
if raw then
  S = cmsgpack.unpack(raw)
else
  S = {m = {}, w = {}, hinf = 0}
end
-- cmsgpack gives an empty map back as an empty table; these are maps and arrays alike.
S.m = S.m or {}
S.w = S.w or {}

-- ===== the scheduler (sched.rs) =====

local function head_weight(K, name)
  local id = K.lists[name].ids[1]
  if not id then return 0 end
  return S.w[id].w
end

local function list_for(K, class, tenant, share)
  if K.ord == 'fair' and tenant ~= '' then
    local name = 't' .. class .. ':' .. tenant
    local L = K.lists[name]
    if L then
      L.sh = share
    else
      K.lists[name] = {c = class, t = tenant, sh = share, cr = 0, ids = {}}
    end
    return name
  end
  K.lists[tostring(class)].sh = share
  return tostring(class)
end

local function joined(K, name)
  local L = K.lists[name]
  K.qd[L.c] = K.qd[L.c] + 1
  if #L.ids == 1 then
    table.insert(K.rings[L.c], name)
  end
end

local function front_turn(K, class)
  local name = K.rings[class][1]
  local L = K.lists[name]
  if not K.vis[class] then
    L.cr = L.cr + L.sh
    K.vis[class] = true
  end
  return name, head_weight(K, name), L.cr
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

local function fast_forward(K, class)
  local rounds
  for _, name in ipairs(K.rings[class]) do
    local L = K.lists[name]
    local need = math.max(0, head_weight(K, name) - L.cr)
    local r = ceil_div(need, L.sh)
    if not rounds or r < rounds then rounds = r end
  end
  rounds = math.max(0, (rounds or 0) - 1)
  for _, name in ipairs(K.rings[class]) do
    local L = K.lists[name]
    L.cr = L.cr + rounds * L.sh
  end
end

local function pick(K)
  local class
  for c = 1, 3 do
    if K.qd[c] > 0 then
      if K.pas[c] >= PASS_LIMIT then
        class = c
        break
      end
      class = class or c
    end
  end
  if not class then return nil end
  local ring = K.rings[class]
  if #ring == 1 then
    local name, w, _ = front_turn(K, class)
    local L = K.lists[name]
    if w > L.cr then
      local need = w - L.cr
      local rounds = need
      if L.sh > 1 then rounds = ceil_div(need, L.sh) end
      L.cr = L.cr + rounds * L.sh
    end
    return name, w
  end
  local skipped = 0
  while true do
    local name, w, cr = front_turn(K, class)
    if w <= cr then return name, w end
    table.insert(ring, table.remove(ring, 1))
    K.vis[class] = false
    skipped = skipped + 1
    if skipped >= #ring then
      fast_forward(K, class)
      skipped = 0
    end
  end
end

-- A waiter left list `name` (already taken out of its ids).
local function left(K, name)
  local L = K.lists[name]
  local class = L.c
  K.qd[class] = K.qd[class] - 1
  if K.qd[class] == 0 then K.pas[class] = 0 end
  if #L.ids > 0 then return end
  local ring = K.rings[class]
  if ring[1] == name then
    table.remove(ring, 1)
    K.vis[class] = false
  else
    for i, n in ipairs(ring) do
      if n == name then
        table.remove(ring, i)
        break
      end
    end
  end
  L.cr = 0
  if L.t then K.lists[name] = nil end
end

local function served(K, name, w)
  local L = K.lists[name]
  local class = L.c
  L.cr = math.max(0, L.cr - w)
  for lower = class + 1, 3 do
    if K.qd[lower] > 0 then K.pas[lower] = K.pas[lower] + 1 end
  end
  K.pas[class] = 0
  left(K, name)
end

local function set_order(K, ord)
  if K.ord == 'fifo' and ord == 'fair' then
    local tenants = false
    for _, L in pairs(K.lists) do
      if L.t then tenants = true end
    end
    if not tenants then
      K.vis = {false, false, false}
      for c = 1, 3 do K.lists[tostring(c)].cr = 0 end
    end
  end
  K.ord = ord
end

-- Waiters expected before one of list `name` with `ahead` ahead of it in that list.
local function position(K, name, ahead)
  local L = K.lists[name]
  local class = L.c
  local higher = 0
  for c = 1, class - 1 do higher = higher + K.qd[c] end
  local rounds = ceil_div(ahead + 1, L.sh)
  local others = 0
  for _, n in ipairs(K.rings[class]) do
    if n ~= name then
      local O = K.lists[n]
      others = others + math.min(#O.ids, rounds * O.sh)
    end
  end
  return higher + ahead + others
end

-- ===== the grant step (key.rs `fill`, group.rs `kick`) =====

local function too_heavy(parallel, w)
  return parallel > 0 and w > parallel
end

local function fits(K, w)
  return w <= math.max(0, K.p - K.inf)
end

local function cap_fits(w)
  return w <= math.max(0, S.cap.p - S.hinf)
end

local function take_head(K, name)
  local id = table.remove(K.lists[name].ids, 1)
  K.n = K.n - 1
  S.w[id] = nil
  return id
end

local function hold(id, model, w)
  redis.call('ZADD', KEYS[2], now + ttl_of(id), id)
  redis.call('HSET', KEYS[3], id, w .. ' ' .. model)
end

local function grant(K, model, name, w)
  local id = take_head(K, name)
  K.inf = K.inf + w
  S.hinf = S.hinf + w
  hold(id, model, w)
  granted[#granted + 1] = id
  served(K, name, w)
end

local function refuse(K, name, parallel)
  local id = take_head(K, name)
  refused[#refused + 1] = id .. '=' .. parallel
  left(K, name)
end

local function unblock(model)
  local line = S.cap.line
  for i, m in ipairs(line) do
    if m == model then
      table.remove(line, i)
      return i == 1
    end
  end
  return false
end

-- Grants the picked heads of `model` while each fits; whether the host line's front changed.
local function fill(model)
  local K = S.m[model]
  local moved = false
  while true do
    local name, w = pick(K)
    if not name then break end
    if too_heavy(K.p, w) then
      refuse(K, name, K.p)
    elseif not fits(K, w) then
      break
    elseif not S.cap then
      grant(K, model, name, w)
    elseif too_heavy(S.cap.p, w) then
      refuse(K, name, S.cap.p)
    else
      local front = S.cap.line[1]
      if (front == nil or front == model) and cap_fits(w) then
        if K.blocked then
          table.remove(S.cap.line, 1)
          K.blocked = false
          moved = true
        end
        grant(K, model, name, w)
      else
        if not K.blocked then
          table.insert(S.cap.line, model)
          K.blocked = true
        end
        return moved
      end
    end
  end
  if K.blocked then
    K.blocked = false
    if S.cap and unblock(model) then moved = true end
  end
  return moved
end

local function kick()
  while S.cap do
    local front = S.cap.line[1]
    if not front or S.hinf >= S.cap.p then return end
    if not fill(front) then return end
  end
end

local function settle(model)
  fill(model)
  kick()
end

-- ===== leases =====

local function key_of(model)
  local K = S.m[model]
  if not K then
    K = new_key()
    S.m[model] = K
  end
  return K
end

-- Units of a holder come back (it released, or its lease expired); its model, or nil.
local function give_back(id)
  local h = redis.call('HGET', KEYS[3], id)
  redis.call('ZREM', KEYS[2], id)
  if not h then return nil end
  redis.call('HDEL', KEYS[3], id)
  local w, model = string.match(h, '^(%d+) (.*)$')
  w = tonumber(w)
  local K = key_of(model)
  K.inf = math.max(0, K.inf - w)
  S.hinf = math.max(0, S.hinf - w)
  return model
end

-- A waiter leaves its list (cancelled, or its lease expired); its model, or nil.
local function unwait(id)
  local W = S.w[id]
  if not W then return nil end
  local K = S.m[W.m]
  local ids = K.lists[W.l].ids
  for i, other in ipairs(ids) do
    if other == id then
      table.remove(ids, i)
      break
    end
  end
  K.n = K.n - 1
  S.w[id] = nil
  left(K, W.l)
  return W.m
end

local function enqueue(K, model, id, w, class, tenant, share)
  local name = list_for(K, class, tenant, share)
  table.insert(K.lists[name].ids, id)
  S.w[id] = {m = model, w = w, l = name, e = now + ttl_of(id)}
  K.n = K.n + 1
  joined(K, name)
end

local function expire()
  local touched = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
    local model = give_back(id)
    if model then touched[model] = true end
    expired = expired + 1
  end
  local dead = {}
  for id, W in pairs(S.w) do
    if W.e <= now then dead[#dead + 1] = id end
  end
  for _, id in ipairs(dead) do
    touched[unwait(id)] = true
    expired = expired + 1
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  for model in pairs(touched) do
    fill(model)
  end
  kick()
end

local function where(id)
  local W = S.w[id]
  if not W then return -1 end
  local K = S.m[W.m]
  for i, other in ipairs(K.lists[W.l].ids) do
    if other == id then return position(K, W.l, i - 1) end
  end
  return -1
end

-- ===== the operations =====

-- The configuration first, each change followed by the grant step the local limiter runs
-- after it (`configure`, `configure_order`: the key's; `configure_host`: the cap's kick).
local model = ARGV[2]
local force = ARGV[7]
local K = S.m[model]
local fresh = K == nil
K = key_of(model)
if fresh or string.find(force, 'k', 1, true) then
  K.p = tonumber(ARGV[3])
  K.q = tonumber(ARGV[4])
  set_order(K, ARGV[5])
  settle(model)
end
if ARGV[6] ~= '' and (not S.cap or string.find(force, 'h', 1, true)) then
  local cap = tonumber(ARGV[6])
  if not S.cap then
    -- A new cap: every model counts against it with what it holds (limiter.rs
    -- `configure_host`).
    S.cap = {p = cap, line = {}}
    for other in pairs(S.m) do
      settle(other)
    end
  end
  S.cap.p = cap
  kick()
end

local op = ARGV[8]
local status, extra, ahead = 0, 0, -1

if op == 'renew' then
  -- Renewals first: a replica that renews late, but renews, keeps its slots.
  for i = 9, #ARGV, 6 do
    local id, kind, w = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
    local exp = now + ttl_of(id)
    if redis.call('ZSCORE', KEYS[4], id) then
      -- released meanwhile: never resurrect it
    elseif redis.call('ZSCORE', KEYS[2], id) then
      redis.call('ZADD', KEYS[2], exp, id)
      if kind == 'w' then reported[#reported + 1] = id end
    elseif kind == 'h' then
      -- Lost (expired, or Redis lost its data): back above the cap if need be.
      hold(id, model, w)
      K.inf = K.inf + w
      S.hinf = S.hinf + w
      restored = restored + 1
    elseif S.w[id] then
      S.w[id].e = exp
    else
      enqueue(K, model, id, w, tonumber(ARGV[i + 3]) + 1, ARGV[i + 4], tonumber(ARGV[i + 5]))
      restored = restored + 1
    end
  end
  -- Leases put back may be granted (waiters) or block grants (holders above the cap).
  settle(model)
end

expire()

if op == 'acquire' then
  local id, w = ARGV[9], tonumber(ARGV[10])
  local class, tenant, share = tonumber(ARGV[11]) + 1, ARGV[12], tonumber(ARGV[13])
  if redis.call('ZSCORE', KEYS[4], id) then
    status = 3
  elseif redis.call('ZSCORE', KEYS[2], id) then
    -- A retry of an acquire whose reply was lost: it holds already (one place, not two).
    redis.call('ZADD', KEYS[2], now + ttl_of(id), id)
    status = 1
  elseif S.w[id] then
    -- A retry while it waits: keep its place in line.
    S.w[id].e = now + ttl_of(id)
    status = 2
  elseif too_heavy(K.p, w) then
    status, extra = 4, K.p
  elseif S.cap and too_heavy(S.cap.p, w) then
    status, extra = 4, S.cap.p
  elseif K.n == 0 and fits(K, w) and (not S.cap or (#S.cap.line == 0 and cap_fits(w))) then
    K.inf = K.inf + w
    S.hinf = S.hinf + w
    hold(id, model, w)
    status = 1
  elseif K.n >= K.q then
    status = 0
  else
    enqueue(K, model, id, w, class, tenant, share)
    fill(model)
    kick()
    if S.w[id] then status = 2 else status = 1 end
  end
  if status == 2 then ahead = where(id) end
elseif op == 'release' then
  -- Also a cancel: a waiter granted in the same instant is released as a holder.
  local id = ARGV[9]
  local holder = give_back(id)
  local gone = holder or unwait(id)
  if holder then status = 1 end
  redis.call('ZADD', KEYS[4], now + 2 * ttl_of(id), id)
  if gone then settle(gone) end
elseif op == 'position' then
  ahead = where(ARGV[9])
end

if #granted > 0 or #refused > 0 then
  local message = table.concat(granted, ' ')
  for _, r in ipairs(refused) do message = message .. ' !' .. r end
  redis.call('PUBLISH', ARGV[1], message)
end

redis.call('SET', KEYS[1], cmsgpack.pack(S), 'PX', KEEP)
for i = 2, 4 do
  redis.call('PEXPIRE', KEYS[i], KEEP)
end
local cap_p, cap_line = -1, 0
if S.cap then cap_p, cap_line = S.cap.p, #S.cap.line end
return {status, K.inf, K.n, expired, granted, refused, reported, restored, ahead, extra,
  {S.hinf, cap_p, cap_line}}
