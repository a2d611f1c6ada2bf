--[[ queue: helpers shared by acquire.lua, release.lua, undo.lua and state.lua, put in front of each when
  the scripts are loaded (a script cannot call another one).
  A name's waiters live in three keys: waitq:{name} (score: ticket, the waiter's
  arrival time, the same on every node), waitx:{name} (score: the time a waiter
  that does not try again drops out) and waitt:{name} (hash: the ttl in ms the
  waiter asked for, so that a release can hand the lock to it, followed by its
  kind: "<ttl> <mode> <permits>", or the ttl alone for an exclusive waiter; an
  older entry may end with " <tag>", which is ignored). A member is "<lease_id>@<process id>".
  Holders (R22): lock:{name} is "<lease_id>:<token>" for an exclusive lease, or
  "=<mode> <permits>" for a group of shared or semaphore leases, whose members
  are in holders:{name} (KEYS[8], zset: lease_id scored by its expiry, node ms)
  and holdert:{name} (KEYS[9], hash: lease_id -> "<token>", or "<decided token>
  <tag>" once the lease's owner committed its idempotency tag: tag.lua, R26). A
  group's lock:{name} expires with its last member; holdert:{name} also keeps the
  committed tag of an exclusive holder. ]]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The token base when the node was synced in this run of the server and is not
-- quarantined; else nil, and the code an acquire returns (-2 unsynced, -1
-- quarantined) with the quarantine's remaining ms.
-- fencegate:synced is "<token base> <run_id>": it counts only for the run of the
-- server that was synced.
local function grantable(synced_key, quarantine_key, run_id)
  local marker = redis.call('GET', synced_key)
  if not marker then
    return nil, -2, 0
  end
  local sep = string.find(marker, ' ', 1, true)
  if not sep or string.sub(marker, sep + 1) ~= run_id then
    return nil, -2, 0
  end
  -- R21: after its quarantine, a resynced node still waits for its counters to be
  -- copied again ("<quarantine key>:recopy", node-global like every fencegate:* key).
  -- Neither key, the common case: one command tells.
  local recopy = quarantine_key .. ':recopy'
  if redis.call('EXISTS', quarantine_key, recopy) > 0 then
    local q = redis.call('PTTL', quarantine_key)
    if q > 0 then
      return nil, -1, q
    end
    if redis.call('EXISTS', recopy) == 1 then
      return nil, -1, 0
    end
  end
  return tonumber(string.sub(marker, 1, sep - 1)), 0, 0
end

-- The group a lock value stands for: mode and permits, or nil for an exclusive holder.
local function group_of(value)
  if not value or string.sub(value, 1, 1) ~= '=' then
    return nil, 0
  end
  local mode, permits = string.match(value, '^=(%a+) (%d+)$')
  return mode, tonumber(permits or '0')
end

-- Drop the group members whose lease expired; true when none is left (the group's
-- keys are then deleted: the lock is free).
local function purge_members(keys, now)
  local dead = redis.call('ZRANGEBYSCORE', keys[8], '-inf', now)
  if #dead > 0 then
    redis.call('ZREM', keys[8], unpack(dead))
    redis.call('HDEL', keys[9], unpack(dead))
  end
  if redis.call('ZCARD', keys[8]) == 0 then
    redis.call('DEL', keys[1], keys[8], keys[9])
    return true
  end
  return false
end

-- The lock value now, with a group's expired members dropped (nil when free).
local function holder(keys)
  local current = redis.call('GET', keys[1])
  if group_of(current) and purge_members(keys, now_ms()) then
    return nil
  end
  return current
end

-- lock:{name} and the group's keys expire with the group's last member.
local function stretch(keys)
  local last = redis.call('ZRANGE', keys[8], -1, -1, 'WITHSCORES')[2]
  if last then
    for i = 1, 3 do
      local key = ({keys[1], keys[8], keys[9]})[i]
      redis.call('PEXPIREAT', key, last)
    end
  end
end

-- The token and tag of a group member (nil when it is not one).
local function member_entry(keys, lease_id)
  local entry = redis.call('HGET', keys[9], lease_id)
  if not entry or not redis.call('ZSCORE', keys[8], lease_id) then
    return nil
  end
  local token, tag = string.match(entry, '^(%d+) ?(.*)$')
  return tonumber(token), tag
end

-- Whether a request of this kind may join the holders now (R22): false when it must
-- wait, 'mismatch' when semaphore holders have other permits.
local function joinable(current, mode, permits, keys)
  if not current then
    return true
  end
  local held_mode, held_permits = group_of(current)
  if mode == 'exclusive' or held_mode ~= mode then
    return false
  end
  if mode == 'semaphore' then
    if held_permits ~= permits then
      return 'mismatch', held_permits
    end
    return redis.call('ZCARD', keys[8]) < permits
  end
  return true
end

-- R2: the next token of the name; a missing counter (first grant of a name, or lost
-- with the node's data) starts above the base, so tokens stay increasing even when
-- every node lost its data. fence:* keys are never deleted. '%d', never tostring:
-- Lua 5.1 prints 14 significant digits.
local function issue(fence_key, base)
  local token = redis.call('INCR', fence_key)
  if token <= base then
    token = base + 1
    redis.call('SET', fence_key, string.format('%d', token))
  end
  return token
end

-- R1, R22-R24: give the lock to lease_id for ttl ms with the next token, alone
-- (exclusive) or as a member of the group of shared or semaphore holders (every
-- grant issues its own token, so that a node orders its grants by token: R11-R13).
-- The caller checked that it may (joinable). No idempotency tag is stored here: a
-- grant is not yet a lease; the owner commits the tag once it decided (tag.lua, R26).
-- An exclusive grant finds the lock free (or held by lease_id alone: acquire.lua
-- clears its committed tag then), so it leaves holders:{name} and holdert:{name}
-- alone: holders:{name} lives only with a group's lock value (same expiry), and a
-- holdert:{name} entry counts only while its lease holds lock:{name} (holds), so one
-- that outlives its exclusive lock by a clock tick names nobody (its lease is not
-- granted again: an owner commits a tag once it decided, and tries no more).
local function grant(keys, base, lease_id, ttl, mode, permits)
  local token = issue(keys[2], base)
  local value = string.format('%d', token)
  mode = mode or 'exclusive'
  if mode == 'exclusive' then
    redis.call('SET', keys[1], lease_id .. ':' .. value, 'PX', ttl)
    return token
  end
  if not group_of(redis.call('GET', keys[1])) then
    redis.call('DEL', keys[8], keys[9])
  end
  redis.call('SET', keys[1], '=' .. mode .. ' ' .. string.format('%d', permits), 'PX', ttl)
  redis.call('ZADD', keys[8], now_ms() + tonumber(ttl), lease_id)
  redis.call('HSET', keys[9], lease_id, value)
  stretch(keys)
  return token
end

-- Whether lease_id holds the lock on this node now (current: holder(keys)), and the
-- ms its hold has left.
local function holds(keys, current, lease_id)
  if group_of(current) then
    local expiry = tonumber(redis.call('ZSCORE', keys[8], lease_id) or '0')
    local left = expiry - now_ms()
    return left > 0 and redis.call('HEXISTS', keys[9], lease_id) == 1, left
  end
  if current and string.sub(current, 1, #lease_id + 1) == lease_id .. ':' then
    return true, redis.call('PTTL', keys[1])
  end
  return false, 0
end

-- R26: the lease committed with this tag that still holds the lock here
-- ({lease_id, decided token, pttl}), or nil. holdert:{name} maps a holder to
-- "<token>" or, once its owner committed a tag (tag.lua), "<decided token> <tag>".
local function tagged(keys, current, tag)
  if tag == '' or redis.call('EXISTS', keys[9]) == 0 then
    return nil
  end
  local entries = redis.call('HGETALL', keys[9])
  for i = 1, #entries, 2 do
    local token, t = string.match(entries[i + 1], '^(%d+) ?(.*)$')
    if t == tag then
      local held, left = holds(keys, current, entries[i])
      if held then
        return {entries[i], tonumber(token), left}
      end
    end
  end
  return nil
end

-- A waiter's kind from its waitt:{name} entry: ttl, mode, permits.
local function waiter_kind(spec)
  local ttl, mode, permits = string.match(spec, '^(%d+) (%a+) (%d+)')
  if not ttl then
    return string.match(spec, '^%d+') or spec, 'exclusive', 0
  end
  return ttl, mode, tonumber(permits)
end

-- fence:{name} now (0 when no grant was ever made on this node).
local function counter(fence_key)
  return tonumber(redis.call('GET', fence_key) or '0')
end

local function enqueue(q, x, t, member, ticket, ttl, keepalive, now)
  redis.call('ZADD', q, 'NX', ticket, member)
  redis.call('ZADD', x, now + keepalive, member)
  redis.call('HSET', t, member, ttl)
  -- queues of names nobody asks for again must not stay forever
  redis.call('PEXPIRE', q, 2 * keepalive)
  redis.call('PEXPIRE', x, 2 * keepalive)
  redis.call('PEXPIRE', t, 2 * keepalive)
end

local function dequeue(q, x, t, member)
  local n = redis.call('ZREM', q, member)
  if n == 1 then  -- the three keys hold the same members: one not in q is in none
    redis.call('ZREM', x, member)
    redis.call('HDEL', t, member)
  end
  return n
end

-- Drop waiters whose keepalive ran out (a crashed process leaves its place behind).
local function purge(q, x, t, now)
  local dead = redis.call('ZRANGEBYSCORE', x, '-inf', now, 'LIMIT', 0, 100)
  if #dead > 0 then
    redis.call('ZREM', x, unpack(dead))
    redis.call('ZREM', q, unpack(dead))
    redis.call('HDEL', t, unpack(dead))
  end
end

-- R9, R25: a lock or a permit on this node just became free: grant it to the
-- earliest live waiter, as acquire.lua would (a new token, the ttl it asked for),
-- and, while the next waiter may join the holders (shared after shared, semaphore
-- while permits are left), to that one too; to each publish
-- "<name>\n<released lease>\n<waiter>\n<token>" on "<channel>:<waiter's process>".
-- A node that cannot grant (unsynced, quarantined), or a head that cannot join,
-- gets the first three lines alone: a wake-up to try. Nobody queued: nothing is
-- published.
local function hand_over(keys, channel, name, released, run_id)
  if redis.call('EXISTS', keys[6]) == 0 then
    return
  end
  purge(keys[5], keys[6], keys[7], now_ms())
  for _ = 1, 1000 do
    local head = redis.call('ZRANGE', keys[5], 0, 0)[1]
    if not head then
      return
    end
    local at = string.find(head, '@', 1, true)
    if not at then
      return  -- not a member this version queued
    end
    local waiter = string.sub(head, 1, at - 1)
    local message = name .. '\n' .. released .. '\n' .. waiter
    local spec = redis.call('HGET', keys[7], head)
    local base = spec and grantable(keys[3], keys[4], run_id)
    local ttl, mode, permits
    if spec then
      ttl, mode, permits = waiter_kind(spec)
    end
    local may = base and joinable(holder(keys), mode, permits, keys)
    if may == true then
      dequeue(keys[5], keys[6], keys[7], head)
      local token = grant(keys, base, waiter, ttl, mode, permits)
      message = message .. '\n' .. string.format('%d', token)
    elseif base and may ~= 'mismatch' then
      return  -- it waits for the holders; a mismatch of permits is woken to learn it
    end
    redis.call('PUBLISH', channel .. ':' .. string.sub(head, at + 1), message)
    if may ~= true or mode == 'exclusive' then
      return
    end
  end
end
