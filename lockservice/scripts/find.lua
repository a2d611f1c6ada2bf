--[[ find: the lease holding the lock with an idempotency tag committed (R26), read only.
  KEYS[1] lock:{name}  KEYS[2] fence:{name}  KEYS[3] fencegate:synced
  KEYS[4] fencegate:quarantine  KEYS[5..7] waitq, waitx, waitt:{name}
  KEYS[8] holders:{name}  KEYS[9] holdert:{name}
  ARGV[1] tag  ARGV[2] the node's run_id as the caller read it when it connected
  Returns {token, pttl, lease_id} of the lease committed with the tag (token: the
  one its owner decided), {0} when none is, {-2, 0} on a node not synced in this
  run and {-1, pttl} on a quarantined one (R17: it may have forgotten the tag). ]]
local base, code, pttl = grantable(KEYS[3], KEYS[4], ARGV[2])
if not base then
  return {code, pttl}
end
local found = tagged(KEYS, holder(KEYS), ARGV[1])
if not found then
  return {0}
end
return {found[2], found[3], found[1]}
