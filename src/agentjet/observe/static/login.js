"use strict";
(() => {
  const q = new URLSearchParams(location.search);
  const next = q.get("next");
  if (next && next.startsWith("/dashboard/")) document.getElementById("next").value = next;
  const messages = {
    wrong: "That token is not this server's read or admin token.",
    no_token: "This server has no read token and no admin token, so nobody can log in. Start it with --read-token (or --admin-token).",
  };
  const err = q.get("error");
  if (err) document.getElementById("error").textContent = messages[err] || "Log in failed.";
})();
