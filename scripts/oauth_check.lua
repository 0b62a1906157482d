-- Dovecot's Lua passdb for XOAUTH2 and OAUTHBEARER in the test kit: the token arrives as the
-- password; scripts/oauth_check.py asks the token endpoint whether it is good for this user.
-- The path of the checker is set by scripts/services/oauth.sh when it installs this file.
local checker = "@CHECKER@"

function auth_password_verify(request, password)
  local pipe = io.popen("/usr/bin/python3 " .. checker, "w")
  if pipe == nil then
    return dovecot.auth.PASSDB_RESULT_INTERNAL_FAILURE, "cannot run the token checker"
  end
  pipe:write(request.user .. "\0" .. password)
  local ok, _, code = pipe:close()
  if ok then
    return dovecot.auth.PASSDB_RESULT_OK, ""
  elseif code == 1 then
    return dovecot.auth.PASSDB_RESULT_PASSWORD_MISMATCH, "the token endpoint refused the token"
  end
  return dovecot.auth.PASSDB_RESULT_INTERNAL_FAILURE, "the token endpoint cannot be reached"
end

function auth_passdb_lookup(request)
  return dovecot.auth.PASSDB_RESULT_USER_UNKNOWN, ""
end
